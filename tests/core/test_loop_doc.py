"""docs/loop.md opens with the step's code as ``loop/step.py`` holds it: the copy and the
source are the same text."""

import inspect
import re
from pathlib import Path

from kiln.core.loop.step import train_step

DOC = Path(__file__).resolve().parents[2] / "docs" / "loop.md"


def test_loop_md_opens_with_the_step_as_the_source_holds_it() -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert blocks, "docs/loop.md has no python block"
    source = inspect.getsource(train_step)
    assert blocks[0] == source, (
        "docs/loop.md's first block differs from train_step in loop/step.py: copy the "
        "function there again"
    )
