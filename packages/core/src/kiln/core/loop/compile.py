"""How ``fit`` compiles: the whole module or each repeated block, and inductor's disk caches.

- Whole module (default): ``torch.compile(module)`` before ``fabric.setup``.
- Regional (``compile.regional=true``): every block of an ``nn.ModuleList`` or
  ``nn.Sequential`` whose children all share one class (transformer layers, timm blocks)
  is compiled in place with ``block.compile()``. Identical blocks share one compiled
  graph, so compile time stops growing with depth (PyTorch's regional-compilation
  recipe). In-place compilation keeps parameter names, so checkpoints carry no
  ``_orig_mod.`` prefix; it is undone after the fit.
- ``compile.trace`` (:func:`kiln.core.upstream_internals.structured_trace`): torch's
  structured compile trace, the log ``TORCH_TRACE`` writes and ``tlparse`` reads.
- ``compile.cache_dir``: inductor's FX graph cache and the AOTAutograd cache are switched on
  and kept in that directory for the fit, so the jobs of a sweep (and re-runs) that compile
  the same graphs pay for them once. Each fit still starts from a clean in-memory dynamo
  state (``CompileWatch.start``); the telemetry says which caches hit (cold or warm).
"""

from __future__ import annotations

import os
from collections.abc import Generator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
from torch import nn

from kiln.core.blocks import repeated_blocks
from kiln.core.config import CompileConfig

_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


@contextmanager
def compile_scope(
    module: nn.Module, config: CompileConfig
) -> Generator[list[nn.Module], None, None]:
    """For the duration of a fit: inductor's caches as configured, regional blocks compiled.

    Yields:
        The blocks compiled in place (empty unless ``config.regional``).

    Raises:
        ValueError: ``compile.regional=true`` on a module with no repeated blocks.
    """
    with ExitStack() as stack:
        if config.enabled and config.cache_dir is not None:
            stack.enter_context(_disk_caches(config.cache_dir))
        blocks: list[nn.Module] = []
        if config.enabled and config.regional:
            blocks = repeated_blocks(module)
            if not blocks:
                raise ValueError(
                    f"compile.regional=true but {type(module).__name__} has no nn.ModuleList "
                    "of blocks of one class to compile; use compile.regional=false"
                )
            stack.callback(_uncompile, blocks)
            for block in blocks:
                # torch leaves Module.compile's arguments unannotated
                block.compile(**config.torch_compile_kwargs())  # pyright: ignore[reportUnknownMemberType]
        yield blocks


def _uncompile(blocks: list[nn.Module]) -> None:
    # what Module.compile sets; the module is eager again after the fit
    for block in blocks:
        block._compiled_call_impl = None  # pyright: ignore[reportPrivateUsage]


@contextmanager
def _disk_caches(directory: str) -> Generator[None, None, None]:
    """FX graph and AOTAutograd caches on, in ``directory``; the previous settings after."""
    # private modules, but where torch keeps these switches (no public API has them)
    import torch._functorch.config as functorch_config  # pyright: ignore[reportPrivateUsage]
    import torch._inductor.config as inductor_config  # pyright: ignore[reportPrivateUsage]

    os.makedirs(directory, exist_ok=True)
    previous = os.environ.get(_CACHE_ENV)
    os.environ[_CACHE_ENV] = os.path.abspath(directory)
    try:
        with (
            # (patch's **kwargs are unannotated)
            inductor_config.patch(fx_graph_cache=True),  # pyright: ignore[reportUnknownMemberType]
            functorch_config.patch(enable_autograd_cache=True),  # pyright: ignore[reportUnknownMemberType]
        ):
            yield
    finally:
        if previous is None:
            os.environ.pop(_CACHE_ENV, None)
        else:
            os.environ[_CACHE_ENV] = previous


class OwnGradsUnderCudaGraphs:
    """With CUDA graphs and accumulation, copy the gradients out of the graphs' memory pool
    after a window's first backward: it hands its output over as ``.grad``, which the next
    micro-batch's replay overwrites before the later backwards add to it."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module, self._first = module, False

    def on_window_start(self, window: list[Any]) -> None:
        self._first = len(window) > 1

    def on_after_backward(self) -> None:
        if self._first:
            self._first = False
            for p in self.module.parameters():
                if p.grad is not None:
                    p.grad = p.grad.clone()
