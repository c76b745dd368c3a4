"""Name the stage a piece of work is in, so an error says where it happened.

::

    with stage("first step"):
        ...                        # an exception leaves with exc.kiln_stage == "first step"
    ...
    except Exception as exc:
        reason = f"{stage_of(exc, 'setup')}: {exc}"

The innermost stage wins: an exception keeps the first name it is given.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

_ATTR = "kiln_stage"


@contextmanager
def stage(name: str) -> Iterator[None]:
    """Attribute an exception raised inside the block to stage ``name`` (then re-raise it)."""
    try:
        yield
    except BaseException as exc:
        if getattr(exc, _ATTR, None) is None:
            setattr(exc, _ATTR, name)
        raise


def stage_of(exc: BaseException, default: str | None = None) -> str | None:
    """The stage ``exc`` was raised in, or ``default`` outside every :func:`stage`."""
    return getattr(exc, _ATTR, None) or default
