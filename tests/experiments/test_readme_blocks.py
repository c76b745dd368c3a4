"""Every fenced code block of README.md, docs/*.md and packages/*/README.md that is a command
or a config runs here, or says on the line before its fence why it cannot
(``<!-- illustrative: a SLURM cluster -->``); a shell command that cannot run is a skip with
that reason, so the count says what ran, and an illustrative Python sketch still parses and
imports only what kiln has.

Cheaply: each shell command is a test of its own. A ``kiln-train``/``kiln-bench`` command is
composed and validated the way the entry point does it (each job of a sweep; also inside
illustrative blocks); ``kiln-export``, ``kiln-eval``, ``kiln-report``, the W&B reader and
``scripts/*.py`` parse their arguments with their own parsers; ``make`` targets dry-run;
Python blocks run in a fresh interpreter per page; YAML is composed (a config group option)
or instantiated (a ``_target_``); TOML parses.
"""

from __future__ import annotations

import argparse
import ast
import itertools
import json
import re
import runpy
import subprocess
import sys
import tomllib

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf, open_dict
from readme_blocks import DOCS, ROOT, Block, commands, program, read_blocks
from train_helpers import compose_train

from kiln.experiments.settings.compose import config_dir

BLOCKS = [block for doc in DOCS for block in read_blocks(doc)]
SHELL = {"bash", "sh", "console"}
PLUGIN_SRC = ROOT / "tests" / "plugin_example"
# The README's placeholder package is the example plugin (a complete one).
PLACEHOLDERS = {"my_pkg": "kiln_plugin_example"}
ARGPARSE_COMMANDS = {
    "kiln-export": "kiln.experiments.export.cli",
    "kiln-eval": "kiln.experiments.eval.cli",
    "kiln-report": "kiln.experiments.report.cli",
    "kiln.experiments.tracking.wandb_files": "kiln.experiments.tracking.wandb_files",
}
# Commands that only look at what an earlier command wrote.
READ_ONLY = {"ls"}
SHELL_COMMANDS = [
    (block, argv) for block in BLOCKS if block.lang in SHELL for argv in commands(block.text)
]


def _jobs(args: list[str]) -> list[list[str]]:
    """The override lists of each job a (multi)run of ``args`` starts (sweeps expanded)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides, skip = [], False
    for arg in args:
        if skip or arg in ("-m", "--multirun"):
            skip = False
            continue
        skip = arg in ("--cfg", "-c", "--package", "-p")
        if not skip and not arg.startswith("-"):
            overrides.append(arg)
    choices = []
    for override in OverridesParser.create().parse_overrides(overrides):
        if override.is_sweep_override():
            key = override.get_key_element()
            choices.append([f"{key}={v}" for v in override.sweep_string_iterator()])
        else:
            choices.append([override.input_line])
    return [list(job) for job in itertools.product(*choices)]


def _compose(name: str, overrides: list[str]) -> None:
    """Compose and validate ``name`` (train or bench) as its entry point does."""
    if name == "kiln-train":
        from kiln.experiments.train.train_config import validate

        # the example plugin stands in for the user's installed one, whose configs/ folder
        # kiln's search-path plugin adds (test_plugin_configs.py installs it for real)
        plugin = "hydra.searchpath=[pkg://kiln_plugin_example.configs]"
        searched = any(o.startswith("hydra.searchpath") for o in overrides)
        cfg = compose_train([*overrides, *([] if searched else [plugin])], hydra_config=True)
    else:
        from kiln.experiments.bench.bench_config import register_configs

        register_configs()
        with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
            cfg = compose("bench", overrides=overrides, return_hydra_config=True)
        validate = OmegaConf.to_object
    with open_dict(cfg):
        del cfg["hydra"]
    cfg.paths.output_dir = "/tmp/kiln-readme-compose"  # ${hydra:...} exists only in a job
    validate(cfg)


def _real_names(arg: str) -> str:
    for placeholder, real in PLACEHOLDERS.items():
        arg = arg.replace(placeholder, real)
    return arg


class _Parsed(Exception):
    pass


def _stop_after_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    real = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, *a, **kw):
        real(self, *a, **kw)
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)


def _parse_only(module: str, args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Run ``module.main(args)`` up to its argument parsing (a bad flag fails it)."""
    import importlib

    _stop_after_parsing(monkeypatch)
    with pytest.raises(_Parsed):
        importlib.import_module(module).main(args)


def _parse_script(script: str, args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Run ``scripts/<name>.py args`` as ``__main__`` up to its argument parsing."""
    path = ROOT / script
    assert path.is_file(), f"{script} does not exist"
    _stop_after_parsing(monkeypatch)
    monkeypatch.setattr(sys, "argv", [str(path), *args])
    with pytest.raises(_Parsed):
        runpy.run_path(str(path), run_name="__main__")


def _check_paths(name: str, args: list[str]) -> None:
    """``pytest <paths>`` names tests of the checkout; ``pip install <path>`` a project of it
    (test_plugin_configs.py installs the example plugin for real)."""
    paths = [a for a in args if not a.startswith("-") and "/" in a]
    if name == "pip":
        assert args[:1] == ["install"], args
        paths = [f"{p}/pyproject.toml" for p in paths]
    assert paths and all((ROOT / p).exists() for p in paths), args


def _run_command(argv: list[str], block: Block, monkeypatch: pytest.MonkeyPatch) -> None:
    name, args = program(argv)
    args = [_real_names(a) for a in args]
    if name in ("kiln-train", "kiln-bench"):
        for job in _jobs(args):
            _compose(name, job)
    elif name in ARGPARSE_COMMANDS:
        _parse_only(ARGPARSE_COMMANDS[name], args, monkeypatch)
    elif name.startswith("scripts/") and name.endswith(".py"):
        _parse_script(name, args, monkeypatch)
    elif name == "make":
        targets = [a for a in args if "=" not in a]
        make_args = [a.split("=", 1)[1] for a in args if a.startswith("ARGS=")]
        proc = subprocess.run(["make", "-n", *targets], cwd=ROOT, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        if make_args and targets == ["train"]:
            _compose("kiln-train", make_args[0].split())
    elif name in ("pytest", "pip") and not block.illustrative:
        _check_paths(name, args)
    elif block.illustrative:
        pytest.skip(f"{block.where}: illustrative: {block.reason}")
    elif name in READ_ONLY:
        pytest.skip(f"{block.where}: `{name}` only reads what an earlier command wrote")
    else:
        raise AssertionError(
            f"{block.where}: `{' '.join(argv)}` cannot run in the tests; give the block "
            "a test here or mark it `<!-- illustrative: why -->` on the line before its fence"
        )


def _words(text: str) -> set[str]:
    return {word.strip(".,") for word in text.split()}


def _ids(blocks: list[Block]) -> list[str]:
    return [f"{b.doc.relative_to(ROOT)}:{b.line}" for b in blocks]


@pytest.mark.parametrize(
    ("block", "argv"),
    SHELL_COMMANDS,
    ids=[f"{b.where}:{program(argv)[0]}" for b, argv in SHELL_COMMANDS],
)
def test_shell_command_runs(block: Block, argv: list[str], monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(PLUGIN_SRC))
    _run_command(argv, block, monkeypatch)


SKETCHES = [b for b in BLOCKS if b.illustrative and b.lang == "python"]


def _signature(text: str) -> tuple[str, list[str]]:
    """The function and parameter names of a signature block (``fit(\n    module,  # ...``)."""
    return text.split("(", 1)[0].strip(), re.findall(r"^\s+(\w+)\s*[,=]", text, re.MULTILINE)


@pytest.mark.parametrize("block", SKETCHES, ids=_ids(SKETCHES))
def test_an_illustrative_python_sketch_names_what_kiln_has(block: Block):
    # A sketch does not run, but it is Python, and what it imports from kiln exists; a block
    # that is a signature (not Python: `fit(module, ..., *, ...) -> FitResult`) shows the
    # function's parameters. (Trees and measured outputs have nothing a test could check.)
    import importlib
    import inspect

    try:
        tree = ast.parse(block.text)
    except SyntaxError:
        name, shown = _signature(block.text)
        function = getattr(importlib.import_module("kiln.core"), name, None)
        assert function is not None, f"{block.where}: not Python, nor a kiln.core signature"
        real = list(inspect.signature(function).parameters)
        assert shown == real, f"{block.where}: kiln.core.{name} takes {real}"
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kiln."):
            module = importlib.import_module(str(node.module))
            missing = [a.name for a in node.names if not hasattr(module, a.name)]
            assert not missing, f"{block.where}: {node.module} has no {missing}"


def test_every_block_is_run_or_marked_illustrative():
    runnable = SHELL | {"python", "yaml", "toml", "text"}
    unmarked = [b.where for b in BLOCKS if b.lang not in runnable and not b.illustrative]
    assert not unmarked, f"blocks no test runs and not marked illustrative: {unmarked}"


def test_error_examples_fail_with_the_message_shown():
    # ```text blocks list `$ kiln-train <args>  -> <the error it prints>`
    examples = [(b, line) for b in BLOCKS if b.lang == "text" for line in b.text.splitlines()]
    assert examples
    for block, line in examples:
        assert line.startswith("$ ") and " -> " in line, f"{block.where}: {line}"
        command, message = line[2:].split(" -> ", 1)
        name, args = program(command.split())
        with pytest.raises(Exception) as err:  # any error: its message is checked
            _compose(name, args)
        expected = message.split(": ", 1)[-1] if message.startswith("ValueError") else message
        chain, cause = [], err.value
        while cause is not None:  # Hydra wraps OmegaConf's error
            chain.append(str(cause))
            cause = cause.__cause__ or cause.__context__
        # the README writes Hydra's multi-line message on one line: compare the words
        missing = _words(expected) - _words(" ".join(chain))
        assert not missing, (block.where, missing, str(err.value))


def test_toml_blocks_parse_and_name_kilns_entry_point_group():
    for block in (b for b in BLOCKS if b.lang == "toml"):
        parsed = tomllib.loads(block.text)
        group = parsed.get("project", {}).get("entry-points", {}).get("kiln.plugins")
        assert group, f"{block.where}: no kiln.plugins entry point"
        plugin = tomllib.loads((PLUGIN_SRC / "pyproject.toml").read_text())
        assert "kiln.plugins" in plugin["project"]["entry-points"]


def test_config_group_yaml_blocks_compose(tmp_path, monkeypatch: pytest.MonkeyPatch):
    # a YAML whose first line names its file (`# my_pkg/configs/model/x.yaml`) is an option
    # of that group; one with a top-level _target_ is run by the Python block test
    blocks = [b for b in BLOCKS if b.lang == "yaml" and "_target_" not in b.text]
    assert blocks
    for block in blocks:
        path = block.text.splitlines()[0].removeprefix("#").strip()
        group, option = path.split("configs/", 1)[1].removesuffix(".yaml").split("/")
        target = tmp_path / str(block.line) / group / f"{option}.yaml"
        target.parent.mkdir(parents=True)
        target.write_text(block.text)
        _compose(
            "kiln-train", [f"{group}={option}", f"hydra.searchpath=[file://{target.parents[1]}]"]
        )


# One interpreter imports what the blocks import, then forks a process per page (a page's
# blocks share it, as a reader's session would), so each page starts clean without paying
# the imports again. Each block runs in its own namespace; a page's child writes the failing
# ones (doc line and error) and its output into its folder and exits 1 if any failed.
PYTHON_RUNNER = """
import json, os, sys, traceback
import torch, lightning.fabric, transformers, kiln.core, kiln.models  # noqa: F401
pages = json.load(sys.stdin)
for folder, blocks in pages.items():
    pid = os.fork()
    if pid == 0:
        os.chdir(folder)
        log = os.open("output.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(log, 1)
        os.dup2(log, 2)
        failed = []
        for block in blocks:
            try:
                if block["lang"] == "yaml":
                    from hydra.utils import instantiate
                    from omegaconf import OmegaConf
                    instantiate(OmegaConf.create(block["text"]))
                else:
                    exec(compile(block["text"], block["where"], "exec"), {"__name__": "__readme__"})
            except Exception:
                failed.append(block["where"] + "\\n" + traceback.format_exc(limit=-3))
        with open("failed.txt", "w") as out:
            out.write("\\n".join(failed))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1 if failed else 0)
    _, status = os.waitpid(pid, 0)
    with open(os.path.join(folder, "exit_status"), "w") as out:
        out.write(str(os.waitstatus_to_exitcode(status)))
"""


def _python_blocks(doc) -> list[dict[str, str]]:
    return [
        {"where": b.where, "lang": b.lang, "text": b.text}
        for b in read_blocks(doc)
        if not b.illustrative
        and (b.lang == "python" or (b.lang == "yaml" and "_target_" in b.text))
    ]


@pytest.fixture(scope="module")
def python_pages(tmp_path_factory) -> dict[str, tuple[int | None, str]]:
    """Each page's exit status (``None``: it never ended) and what it printed and failed."""
    root = tmp_path_factory.mktemp("python_blocks")
    pages = {}
    for i, doc in enumerate(DOCS):
        if blocks := _python_blocks(doc):
            (root / str(i)).mkdir()
            pages[str(root / str(i))] = blocks
    proc = subprocess.run(
        [sys.executable, "-c", PYTHON_RUNNER],
        input=json.dumps(pages),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    results = {}
    for i, doc in enumerate(DOCS):
        folder = root / str(i)
        if not (folder / "exit_status").exists():
            results[str(doc)] = (None, proc.stdout[-3000:] + proc.stderr[-3000:])
            continue
        text = (folder / "failed.txt").read_text() if (folder / "failed.txt").exists() else ""
        output = (folder / "output.log").read_text()
        results[str(doc)] = (int((folder / "exit_status").read_text()), text + output[-3000:])
    return results


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_python_blocks_run(doc, python_pages):
    if not _python_blocks(doc):
        pytest.skip(f"{doc.relative_to(ROOT)} has no Python block that runs")
    status, output = python_pages[str(doc)]
    assert status == 0, output[-6000:]


# A repository path in backticks (`tests/core/test_resume.py`, `data/base.py` in a package's
# README) or a relative Markdown link: drift between the docs and the tree fails here.
REPO_PATH = re.compile(r"`([\w./-]+/[\w.-]+\.(?:py|sh|yaml|md|toml|json))`")
LINK = re.compile(r"\]\(([^)#:\s]+)(?:#[^)]*)?\)")
SOURCE_ROOTS = [
    *ROOT.glob("packages/*/src"),
    *(ROOT / "packages" / p / "src" / "kiln" / p for p in ("core", "models", "experiments")),
]
# Paths a run writes, or git ignores: named in the docs, never in the tree.
NOT_IN_TREE = {"checkpoints/run.json", "configs/local/default.yaml"}


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_named_paths_and_links_exist(doc):
    text = doc.read_text()
    missing = []
    for path in REPO_PATH.findall(text):
        if "my_pkg" in path or path in NOT_IN_TREE:  # my_pkg: the docs' placeholder package
            continue
        if not any((base / path).exists() for base in (ROOT, doc.parent, *SOURCE_ROOTS)):
            missing.append(path)
    for link in LINK.findall(text):
        target = (doc.parent / link).resolve()
        if not target.exists():
            missing.append(link)
    assert not missing, f"{doc.relative_to(ROOT)} names what the tree does not hold: {missing}"


CONFIG_KEY = re.compile(r"`(trainer|compile)\.(\w+)(?![\w.])")


# `kiln.core.precision_audit(...)`, `kiln.models.testing`: a dotted name of kiln's in the prose
KILN_NAME = re.compile(r"`(kiln\.(?:core|models|experiments)(?:\.\w+)+)")


def _resolves(name: str) -> bool:
    """Whether ``name`` is a module of kiln's or an attribute of one (imported as a user would)."""
    import importlib

    parts = name.split(".")
    for cut in range(len(parts), 1, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_named_kiln_objects_exist(doc):
    missing = sorted({n for n in KILN_NAME.findall(doc.read_text()) if not _resolves(n)})
    assert not missing, f"{doc.relative_to(ROOT)} names what kiln does not have: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_named_trainer_and_compile_keys_exist(doc):
    # `trainer.<key>` and `compile.<key>` in the prose name fields of kiln.core's configs
    import dataclasses

    from kiln.core import CompileConfig, TrainerConfig

    fields = {
        group: {f.name for f in dataclasses.fields(config)}
        for group, config in (("trainer", TrainerConfig), ("compile", CompileConfig))
    }
    named = [(g, k) for g, k in CONFIG_KEY.findall(doc.read_text()) if k != "py"]  # compile.py
    unknown = [f"{g}.{k}" for g, k in named if k not in fields[g]]
    assert not unknown, f"{doc.relative_to(ROOT)} names config keys kiln.core lacks: {unknown}"
