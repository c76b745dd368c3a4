"""What each rank holds under DDP and FSDP, with and without activation checkpointing.

Trains the same Llama (kiln.models ``hf-lm``, config-built: random init, from one seed) on
kiln's generated text on 2 processes (gloo on the CPU, NCCL on GPUs) four ways: ``ddp``,
``fsdp``, each with ``trainer.activation_checkpointing`` off and on, one after the other in
the same two processes. Each fit's telemetry gives this rank's parameter, gradient and
optimizer-state bytes (FSDP: its local shards, counted exactly) and the fit's own peak
memory (CUDA: allocated tensors; CPU: the resident set, which also holds the Python runtime
and libraries) and what it held when it began: ``rise`` = peak - start is what the fit
itself added. The state figures are exact counts, not timings: one run gives them.

    uv run --all-packages python scripts/bench_memory.py [--layers 8 --seq 256 --steps 4]

The last line is ``fsdp_state_ratio=<FSDP/DDP per-rank state bytes>
ac_rise_ratio=<DDP's peak rise with/without activation checkpointing>``.
"""

from __future__ import annotations

import argparse
import os

import torch

from kiln.core import TrainerConfig, fit, launch

VARIANTS = [("ddp", False), ("fsdp", False), ("ddp", True), ("fsdp", True)]
KEYS = ("param_bytes", "grad_bytes", "optimizer_state_bytes", "peak_memory_mb", "start_memory_mb")


def build(args: argparse.Namespace):
    import kiln.models as km
    from kiln.models.data import CausalLMData

    torch.manual_seed(0)
    config = {
        "hidden_size": args.hidden,
        "num_hidden_layers": args.layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 4 * args.hidden,
        "max_position_embeddings": args.seq,
    }
    data = CausalLMData(num_train=64, num_val=8, batch_size=args.batch, max_length=args.seq)
    return km.create_model("hf-lm", arch="llama", config_overrides=config, data=data)


def variants(args: argparse.Namespace) -> list[dict]:
    """This rank's figures of every variant (top-level: spawned ranks import it)."""
    out = []
    for strategy, checkpointing in VARIANTS:
        model = build(args)
        cfg = TrainerConfig(
            accelerator=args.accelerator,
            devices=2,
            strategy=strategy,
            max_steps=args.steps,
            warmup_steps=1,
            log_every_n_steps=args.steps,
            activation_checkpointing=checkpointing,
            progress=False,
            count_flops=False,
        )
        telemetry = fit(model, cfg).telemetry
        params = sum(p.numel() for p in build(args).parameters())
        out.append(
            {"strategy": strategy, "ac": checkpointing, "params": params}
            | {k: telemetry[k] for k in KEYS}
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--accelerator", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    ranks = launch(variants, 2, args)

    mib = 2**20
    print(
        f"Llama {args.layers} layers x {args.hidden} wide, {ranks[0][0]['params']:,} "
        f"parameters, fp32 AdamW, 2 processes ({args.accelerator}), MiB per rank:"
    )
    print(
        f"{'variant':<12} {'rank':>4} {'params':>8} {'grads':>8} {'optim':>8} "
        f"{'state':>8} {'peak':>8} {'rise':>8}"
    )
    state: dict[tuple[str, bool], float] = {}
    rises: dict[tuple[str, bool], float] = {}
    for rank, rows in enumerate(ranks):
        for row in rows:
            total = row["param_bytes"] + row["grad_bytes"] + row["optimizer_state_bytes"]
            rise = row["peak_memory_mb"] - (row["start_memory_mb"] or 0.0)
            key = (row["strategy"], row["ac"])
            state[key] = max(state.get(key, 0), total)  # the larger rank's
            rises[key] = max(rises.get(key, 0), rise)
            name = row["strategy"] + ("+ac" if row["ac"] else "")
            print(
                f"{name:<12} {rank:>4} {row['param_bytes'] / mib:8.2f} "
                f"{row['grad_bytes'] / mib:8.2f} {row['optimizer_state_bytes'] / mib:8.2f} "
                f"{total / mib:8.2f} {row['peak_memory_mb']:8.1f} {rise:8.1f}"
            )
    for ac in (False, True):
        print(
            f"fsdp/ddp ({'with' if ac else 'without'} activation checkpointing): state "
            f"{state[('fsdp', ac)] / state[('ddp', ac)]:.3f}, rise "
            f"{rises[('fsdp', ac)] / rises[('ddp', ac)]:.3f}"
        )
    for strategy in ("ddp", "fsdp"):
        print(
            f"{strategy} with/without activation checkpointing: rise "
            f"{rises[(strategy, True)] / rises[(strategy, False)]:.3f}"
        )
    print(
        f"fsdp_state_ratio={state[('fsdp', False)] / state[('ddp', False)]:.3f} "
        f"ac_rise_ratio={rises[('ddp', True)] / rises[('ddp', False)]:.3f}"
    )


if __name__ == "__main__":
    main()
