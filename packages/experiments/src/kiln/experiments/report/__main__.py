import sys

from kiln.experiments.report.cli import main

sys.exit(main())
