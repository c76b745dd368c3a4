from kiln.experiments.export.cli import main

main()
