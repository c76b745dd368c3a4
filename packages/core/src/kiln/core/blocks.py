"""A model's repeated blocks: what regional compile compiles, FSDP shards and activation
checkpointing recomputes, each one at a time."""

from __future__ import annotations

from torch import nn


def repeated_blocks(module: nn.Module) -> list[nn.Module]:
    """The blocks of every ``nn.ModuleList`` or ``nn.Sequential`` (timm) holding at least two
    blocks, all of one class and each with submodules of its own (not bare layers).

    A list nested inside a block that is itself returned is left out: the outer block's
    graph already holds it.
    """
    blocks: list[nn.Module] = []
    for child in module.modules():
        if not isinstance(child, nn.ModuleList | nn.Sequential) or len(child) < 2:
            continue
        if len({type(block) for block in child}) != 1 or not any(child[0].children()):
            continue
        if any(child is inner for block in blocks for inner in block.modules()):
            continue
        blocks.extend(child)
    return blocks
