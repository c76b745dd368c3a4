"""The fenced code blocks of README.md, docs/*.md and the package READMEs, and what each runs."""

from __future__ import annotations

import re
import shlex
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [
    ROOT / "README.md",
    *sorted(ROOT.glob("docs/*.md")),
    *sorted(ROOT.glob("packages/*/README.md")),
]
# On the line before a fence: the block cannot run here, and the comment says why.
ILLUSTRATIVE = re.compile(r"^\s*<!--\s*illustrative:\s*(\S.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
# Prefixes that start a command the way the READMEs do (inside uv's environment).
LAUNCHERS = {"uv", "run", "--frozen", "--all-packages", "python", "-m", "sudo"}
ENTRY_MODULES = {"kiln.experiments.train": "kiln-train", "kiln.experiments.bench": "kiln-bench"}


@dataclass
class Block:
    """One fenced block: where it is, its language, its text and, for an illustrative block,
    why it cannot run (the comment on the line before its fence; empty otherwise)."""

    doc: Path
    line: int
    lang: str
    text: str
    reason: str

    @property
    def illustrative(self) -> bool:
        return bool(self.reason)

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def read_blocks(doc: Path) -> list[Block]:
    """The fenced blocks of ``doc`` (dedented: a block may sit inside a list item)."""
    lines = doc.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if match is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        marked = ILLUSTRATIVE.match(lines[i - 1]) if i > 0 else None
        text = textwrap.dedent("\n".join(lines[i + 1 : end]))
        blocks.append(Block(doc, i + 1, match.group(2), text, marked.group(1) if marked else ""))
        i = end + 1
    return blocks


def commands(text: str) -> list[list[str]]:
    """A shell block's commands as argv lists (continuations joined, comments dropped)."""
    joined = re.sub(r"\\\n", " ", text)
    return [argv for line in joined.splitlines() if (argv := shlex.split(line, comments=True))]


def program(argv: list[str]) -> tuple[str, list[str]]:
    """The program a README command runs and its arguments: ``uv run --all-packages
    kiln-train x`` and ``torchrun ... -m kiln.experiments.train x`` both run ``kiln-train``."""
    if argv[0] == "torchrun" and "-m" in argv:
        module = argv[argv.index("-m") + 1]
        return ENTRY_MODULES.get(module, module), argv[argv.index("-m") + 2 :]
    i = 0
    while i < len(argv) - 1 and argv[i] in LAUNCHERS:
        i += 1
    name = argv[i].removeprefix(".venv/bin/")
    return ENTRY_MODULES.get(name, name), argv[i + 1 :]
