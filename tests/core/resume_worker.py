"""Run by test_resume in a subprocess that the test SIGKILLs mid-run."""

import sys
from pathlib import Path

from test_resume import MODULE_KW, trainer
from toy import ToyTokenModule

from kiln.core import fit

if __name__ == "__main__":
    fit(ToyTokenModule(**MODULE_KW), trainer(Path(sys.argv[1]), int(sys.argv[2])))
