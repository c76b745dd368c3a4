"""Run by test_resume in a subprocess that is SIGKILLed mid-run.

``resume_worker.py DIR STEPS`` trains the toy of test_resume for STEPS steps (the test kills
it from outside). ``resume_worker.py DIR KILL [DEVICES]`` trains the epochs setup of
test_resume (resume='auto') and SIGKILLs itself at KILL (see ``test_resume.Killer``).
"""

import sys
from pathlib import Path

from test_resume import MODULE_KW, epochs_run, trainer
from toy import ToyTokenModule

from kiln.core import fit, launch

if __name__ == "__main__":
    root = Path(sys.argv[1])
    if sys.argv[2].isdigit():
        fit(ToyTokenModule(**MODULE_KW), trainer(root, int(sys.argv[2])))
    else:
        devices = int(sys.argv[3]) if len(sys.argv) > 3 else 1
        if devices == 1:
            epochs_run(root, "auto", sys.argv[2])
        else:
            launch(epochs_run, devices, root, "auto", sys.argv[2], devices)
