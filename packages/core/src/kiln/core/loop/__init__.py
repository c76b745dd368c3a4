"""The loop: ``fit`` (``fit.py``) and its stages, ``setup``, ``resume``, ``train_step``
(``step.py``), what follows each step on its periods (log, validate, checkpoint), and the
pieces they use (data order, optimizers, precision, compile, activation checkpointing, seeds).

Its public names (``__all__``) are what the other kiln packages use; they are imported on
first use, so importing this package imports nothing else.
"""

from typing import TYPE_CHECKING

from kiln.core.lazy import lazy_package

_EXPORTS = {
    "structured_trace": "kiln.core.loop.compile",
    "unpack_optimizers": "kiln.core.loop.optim",
}
__all__ = [
    "structured_trace",
    "unpack_optimizers",
]
lazy_package(__name__, _EXPORTS)

if TYPE_CHECKING:  # what type checkers and IDEs see
    from kiln.core.loop.compile import structured_trace
    from kiln.core.loop.optim import unpack_optimizers
