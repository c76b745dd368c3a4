from kiln.experiments.train.cli import main

main()
