"""Another project's private API is used in one module per package
(``kiln.core.upstream_internals``, ``kiln.experiments.upstream_internals``), each use with its
reason there; torch's private modules that have no public counterpart are listed below with
where and why. This fails when a kiln module imports a new private name, and when a kept one
moves upstream."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

SRC = Path(__file__).parent.parent / "packages"
ISOLATED = {
    "core/src/kiln/core/upstream_internals.py",
    "experiments/src/kiln/experiments/upstream_internals.py",
}
# torch's own private modules kiln reaches for, where torch documents or offers no other:
# file -> the private module paths it may use there.
TORCH_PRIVATE = {
    # inductor's and AOTAutograd's config: torch.compile's documented knobs live only there
    "core/src/kiln/core/loop/compile.py": {"torch._functorch.config", "torch._inductor.config"},
    "experiments/src/kiln/experiments/bench/harness.py": {
        "torch._functorch.config",
        "torch._inductor.config",
    },
    # dynamo's counters (graph breaks, recompiles) and its graph-break log: no public reader
    "core/src/kiln/core/telemetry/compile_watch.py": {"torch._dynamo.utils"},
    # the dispatch-mode base class, module tracker and pytree the audit of dtypes is built on
    "core/src/kiln/core/loop/precision_audit.py": {
        "torch.utils._python_dispatch",
        "torch.distributed._tools.mod_tracker",
        "torch.utils._pytree",
    },
    # dynamo's explain (graph breaks of one call), the tool torch.compile's troubleshooting
    # guide documents; torch.compiler has no counterpart
    "models/src/kiln/models/testing.py": {"torch._dynamo"},
    # the checkpoint wrapper FSDP's docs use for activation checkpointing
    "core/src/kiln/core/loop/activation_checkpointing.py": {
        "torch.distributed.algorithms._checkpoint.checkpoint_wrapper"
    },
}
# underscored, yet documented public API: Python's os._exit, torch's foreach operations
DOCUMENTED = {"os._exit", "torch._foreach_lerp_"}
FOREIGN = {
    "torch",
    "lightning",
    "lightning_fabric",
    "hydra",
    "omegaconf",
    "wandb",
    "atexit",
    "transformers",
    "timm",
    "datasets",
    "evaluate",
    "sys",
    "os",
    "gc",
    "threading",
}


def _private(dotted: str) -> bool:
    return any(p.startswith("_") and not p.startswith("__") for p in dotted.split("."))


def private_uses(path: Path) -> list[str]:
    """``module`` or ``module.name`` for every private import of a foreign project in ``path``,
    and every ``<foreign module>._name`` attribute (``atexit._run_exitfuncs``)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] not in FOREIGN:
                continue
            if _private(node.module):
                found.append(node.module)
            found += [f"{node.module}.{a.name}" for a in node.names if _private(a.name)]
        elif isinstance(node, ast.Import):
            found += [
                a.name for a in node.names if a.name.split(".")[0] in FOREIGN and _private(a.name)
            ]
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            chain = [node.attr]
            base = node.value
            while isinstance(base, ast.Attribute):
                chain.insert(0, base.attr)
                base = base.value
            dotted = ".".join([base.id, *chain]) if isinstance(base, ast.Name) else ""
            if dotted.split(".")[0] in FOREIGN and not dotted.startswith("torch.ops."):
                found.append(dotted)  # torch.ops.aten._to_copy: an operator's public name
    return found


def test_private_api_of_other_projects_is_used_only_where_it_is_kept_with_its_reason():
    stray: list[str] = []
    for path in sorted(SRC.rglob("src/**/*.py")):
        relative = path.relative_to(SRC).as_posix()
        if relative in ISOLATED:
            continue
        allowed = TORCH_PRIVATE.get(relative, set())
        for use in private_uses(path):
            if use in DOCUMENTED:
                continue
            if not any(use == a or use.startswith(a + ".") for a in allowed):
                stray.append(f"{relative}: {use}")
    assert not stray, "private API outside upstream_internals:\n" + "\n".join(stray)


def test_the_scan_finds_a_private_import(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import atexit\nfrom torch.nn.utils.stateless import _reparametrize_module\n"
        "from hydra._internal.core_plugins.basic_sweeper import BasicSweeper\n"
        "atexit._run_exitfuncs()\ntorch.cuda.memory._dump_snapshot('x')\n"
    )
    assert private_uses(sample) == [
        "torch.nn.utils.stateless._reparametrize_module",
        "hydra._internal.core_plugins.basic_sweeper",
        "atexit._run_exitfuncs",
        "torch.cuda.memory._dump_snapshot",
    ]


@pytest.mark.parametrize(
    ("module", "names"),
    [
        ("torch._logging._internal", ["LazyTraceHandler", "TorchLogsFormatter", "trace_log"]),
        ("hydra._internal.core_plugins.basic_sweeper", ["BasicSweeper"]),
        ("atexit", ["_run_exitfuncs"]),
        ("torch.cuda.memory", ["_record_memory_history", "_dump_snapshot"]),
        ("wandb.sdk.launch.inputs.internal", []),
        ("torch._functorch.config", []),
        ("torch._inductor.config", []),
        ("torch._dynamo.utils", ["counters"]),
        ("torch._dynamo", ["explain"]),
        ("torch.utils._python_dispatch", ["TorchDispatchMode"]),
        ("torch.distributed._tools.mod_tracker", ["ModTracker"]),
        ("torch.utils._pytree", ["tree_flatten"]),
        (
            "torch.distributed.algorithms._checkpoint.checkpoint_wrapper",
            ["CheckpointImpl", "CheckpointWrapper", "checkpoint_wrapper"],
        ),
    ],
)
def test_each_kept_private_name_is_still_there_upstream(module, names):
    imported = importlib.import_module(module)
    missing = [n for n in names if not hasattr(imported, n)]
    assert not missing, f"{module} no longer has {missing}: see kiln's upstream_internals"


def test_hydras_basic_sweeper_still_splits_arguments_as_kilns_sweeper_calls_it():
    from kiln.experiments.upstream_internals import basic_sweeper

    params = list(inspect.signature(basic_sweeper().split_arguments).parameters)
    assert params == ["overrides", "max_batch_size"]
