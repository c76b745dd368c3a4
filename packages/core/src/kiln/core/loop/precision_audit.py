"""Precision audit: which ops ran in which dtype, and in which module, over one forward and
backward.

A precision setting says what a run computes in; a model can say otherwise (transformers'
Llama RMSNorm computes in float32 whatever its input, so a ``64-true`` run is not all
float64). The audit watches every aten op a training step and its backward dispatch (a
``TorchDispatchMode``, below autocast: it sees the dtypes ops really ran in) and names the
innermost module running at the time (``ModTracker``: forward hooks, and gradient hooks in
the backward). An op's dtype is the narrowest floating dtype among its tensor inputs and
outputs; a conversion's is the dtype it produces (a float64 -> float32 copy counts as
float32, float32 data made float64 as float64). Ops without floating tensors (integer
indexing, masks) are not counted.

Run it on any module with :func:`precision_audit`, or on a run's first optimizer step with
``TrainerConfig.precision_audit=True`` (the record is the telemetry's ``precision_audit``).
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable, Generator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch.distributed._tools.mod_tracker import ModTracker
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from kiln.core.module_contract import as_dict

MATMUL_OPS = frozenset(
    {
        "aten.mm",
        "aten.addmm",
        "aten.bmm",
        "aten.baddbmm",
        "aten.matmul",
        "aten.linear",
        "aten.convolution",
        "aten.convolution_backward",
        "aten._scaled_dot_product_flash_attention_for_cpu",
        "aten._scaled_dot_product_flash_attention_for_cpu_backward",
        "aten._scaled_dot_product_flash_attention",
        "aten._scaled_dot_product_flash_attention_backward",
        "aten._scaled_dot_product_efficient_attention",
        "aten._scaled_dot_product_efficient_attention_backward",
        "aten._scaled_dot_product_cudnn_attention",
        "aten._scaled_dot_product_cudnn_attention_backward",
    }
)
"""The ops whose dtype decides a step's speed and precision (matmuls, convolutions, SDPA)."""

FULL_DTYPE = {
    "64-true": torch.float64,
    "32-true": torch.float32,
    "bf16-true": torch.bfloat16,
    "16-true": torch.float16,
}
"""What every op of a ``-true`` precision computes in; mixed precisions have no one dtype."""

MIXED_MATMUL_DTYPE = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}
"""What the matmuls of a mixed precision compute in (autocast)."""

_LISTED = 20  # ops named in the record; the rest are counted


@dataclass(frozen=True)
class OpRun:
    """Ops of one kind that ran in one dtype in one module."""

    module: str
    """The innermost module's path from the audited module (``model.layers.0.norm``), ``""``
    outside any submodule (the loss, kiln's loss weighting)."""
    op: str
    """The aten op (``aten.mm``)."""
    dtype: str
    """The narrowest floating dtype among its inputs and outputs (``float32``); for a
    conversion (``aten._to_copy``, ``aten.copy_``), the dtype it produces."""
    backward: bool
    """Whether it ran in the backward."""
    count: int

    def __str__(self) -> str:
        where = self.module or "(top level)"
        phase = "backward" if self.backward else "forward"
        return f"{where}: {self.op} in {self.dtype} ({phase}, x{self.count})"


@dataclass
class PrecisionAudit:
    """What one forward and backward ran, per op, dtype and module."""

    precision: str
    """The precision it ran under (``64-true``, ``bf16-mixed``...)."""
    ops: list[OpRun] = field(default_factory=list[OpRun])

    def dtypes(self, matmuls_only: bool = False) -> dict[str, int]:
        """How many ops ran in each dtype (only the :data:`MATMUL_OPS` with ``matmuls_only``)."""
        counts: Counter[str] = Counter()
        for run in self.ops:
            if not matmuls_only or run.op in MATMUL_OPS:
                counts[run.dtype] += run.count
        return dict(counts)

    def below(self, dtype: torch.dtype) -> list[OpRun]:
        """The ops that ran in a floating dtype narrower than ``dtype``."""
        bits = torch.finfo(dtype).bits
        return [run for run in self.ops if torch.finfo(_dtype(run.dtype)).bits < bits]

    def problems(self) -> list[OpRun]:
        """The ops that did not run as the precision says: under a ``-true`` precision every
        op below its dtype; under a mixed one every matmul not in its half dtype."""
        if self.precision in FULL_DTYPE:
            return self.below(FULL_DTYPE[self.precision])
        half = MIXED_MATMUL_DTYPE.get(self.precision)
        if half is None:
            return []
        name = str(half).removeprefix("torch.")
        return [run for run in self.ops if run.op in MATMUL_OPS and run.dtype != name]

    def record(self) -> dict[str, Any]:
        """A JSON-able summary: op counts per dtype (all, and matmuls), and the ops that did
        not run as the precision says, the first few by name and where."""
        problems = self.problems()
        return {
            "precision": self.precision,
            "ops_by_dtype": self.dtypes(),
            "matmuls_by_dtype": self.dtypes(matmuls_only=True),
            "not_as_precision_says": sum(run.count for run in problems),
            "examples": [str(run) for run in problems[:_LISTED]],
        }

    def __str__(self) -> str:
        problems = self.problems()
        head = (
            f"precision audit ({self.precision}): ops by dtype {self.dtypes()}, matmuls "
            f"{self.dtypes(matmuls_only=True)}"
        )
        if not problems:
            return head + "; every op ran as the precision says"
        listed = "\n  ".join(str(run) for run in problems[:_LISTED])
        more = len(problems) - _LISTED
        tail = f"\n  ... and {more} more" if more > 0 else ""
        return f"{head}; not as the precision says:\n  {listed}{tail}"


def _dtype(name: str) -> torch.dtype:
    return cast(torch.dtype, getattr(torch, name))


_CONVERSIONS = (torch.ops.aten._to_copy, torch.ops.aten.copy_)  # pyright: ignore[reportPrivateUsage]


class _OpLog(TorchDispatchMode):
    """Counts each dispatched op by (module, op, dtype, backward)."""

    def __init__(self, where: Callable[[], str], tracker: Any) -> None:
        super().__init__()  # pyright: ignore[reportUnknownMemberType]  # torch leaves it unannotated
        self.where, self.tracker = where, tracker
        self.counts: Counter[tuple[str, str, str, bool]] = Counter()
        self.total = 0  # ops dispatched so far

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        self.total += 1
        # a conversion computes nothing: it counts in the dtype it produces (an upcast of
        # float32 data to float64 loses nothing, a downcast is where precision goes)
        converts = func.overloadpacket in _CONVERSIONS
        flat, _ = tree_flatten(out if converts else (args, kwargs, out))
        dtypes = {
            t.dtype for t in flat if isinstance(t, torch.Tensor) and torch.is_floating_point(t)
        }
        if dtypes:
            narrowest = min(dtypes, key=lambda d: torch.finfo(d).bits)
            name = str(narrowest).removeprefix("torch.")
            op = f"aten.{func.overloadpacket.__name__}"
            self.counts[(self.where(), op, name, self.tracker.is_bw)] += 1
        return out


@contextmanager
def auditing(root: torch.nn.Module, precision: str) -> Generator[PrecisionAudit]:
    """Record every op run inside the block into the yielded :class:`PrecisionAudit`
    (filled when the block ends); module paths are relative to ``root``.

    The block's forward and backward both count; ops run as they would without the audit
    (nothing is cast or reordered), so a step audited this way is the step itself.
    """
    tracker: Any = ModTracker()  # torch leaves it unannotated
    # name the modules from root (ModTracker names the first module it sees by its class)
    tracker._get_mod_name(root)
    prefix = f"{type(root).__name__}."
    # when each running module was entered (forward, or its backward began): (ops dispatched
    # before, depth). The innermost is the latest; modules entered with no op in between
    # (a module and the child whose output it returns) are told apart by depth.
    entered_at: dict[str, tuple[int, int]] = {}

    def entered(module: torch.nn.Module | None, *_: Any) -> None:
        name: str | None = tracker.get_known_fqn(module) if module is not None else None
        if name is not None:
            entered_at[name] = (log.total, str(name).count("."))

    tracker.register_user_hooks(pre_fw_hook=entered, pre_bw_hook=entered)

    def where() -> str:
        running = [name for name in tracker.parents if name in entered_at]
        if not running:
            return ""
        name = max(running, key=entered_at.__getitem__)
        return name.removeprefix(prefix) if name.startswith(prefix) else ""

    log = _OpLog(where, tracker)
    audit = PrecisionAudit(precision)
    try:
        with tracker, log:
            yield audit
    finally:
        audit.ops = [
            OpRun(module, op, dtype, backward, count)
            for (module, op, dtype, backward), count in log.counts.items()
        ]


def precision_audit(
    module: torch.nn.Module, batch: Any, precision: str = "32-true", accelerator: str = "cpu"
) -> PrecisionAudit:
    """Audit one ``training_step(batch, 0)`` and its backward under ``precision`` as kiln's
    loop runs it: on a copy of ``module`` converted by Fabric's precision plugin (``64-true``
    makes it float64), with the plugin's input conversion and autocast.

    ``module`` itself, its gradients and the random streams are left as they were.

    Args:
        module: A LightningModule following kiln's module contract.
        batch: One micro-batch, as the train loader yields it.
        precision: A Fabric precision (``64-true``, ``32-true``, ``bf16-mixed``...).
        accelerator: Where to run it (``cpu``, ``cuda``).

    Returns:
        The ops by module, op and dtype; ``problems()`` lists those that did not run as the
        precision says, ``record()`` is a JSON-able summary.

    Example:
        >>> audit = precision_audit(model, batch, precision="64-true")
        >>> print(audit)  # names every op that ran below float64, and where
    """
    import lightning as L
    from lightning.fabric.plugins.environments.lightning import LightningEnvironment

    from kiln.core.loop.precision import ExactDoublePrecision
    from kiln.core.loop.step import call_under_precision

    # one local process whatever the environment (no SLURM detection), as fit would run it
    plugins: list[Any] = [LightningEnvironment()]
    if precision == "64-true":
        plugins.append(ExactDoublePrecision())
    fabric = L.Fabric(
        accelerator=accelerator,
        devices=1,
        precision=None if precision == "64-true" else cast(Any, precision),
        plugins=plugins,
    )
    plugin = fabric.strategy.precision
    audited = plugin.convert_module(copy.deepcopy(module)).to(fabric.device)
    step = cast(Callable[..., Any], audited.training_step)  # the contract's hook
    batch = fabric.to_device(cast(object, batch))  # as object: to_device is overloaded
    devices = [fabric.device] if fabric.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), auditing(audited, precision) as audit:  # pyright: ignore[reportUnknownMemberType]
        out = call_under_precision(plugin, step, batch, 0)
        step_out = as_dict(out)
        loss = out if step_out is None else step_out["loss"]
        if loss.requires_grad:
            loss.backward()
    return audit
