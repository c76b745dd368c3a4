from kiln.experiments.eval.cli import main

main()
