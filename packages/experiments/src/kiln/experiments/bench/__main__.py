from kiln.experiments.bench.cli import main

main()
