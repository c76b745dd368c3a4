"""Configuration of a kiln run: what the loop does, and how the model is compiled.

Both are plain dataclasses validated in ``__post_init__`` (litgpt style), so a bad value
fails before any work starts, with a message that lists what is valid. kiln.experiments
registers them in Hydra's ConfigStore; kiln.core never imports Hydra.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, cast

PRECISIONS = ("32-true", "64-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true")
COMPILE_MODES = ("none", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
STRATEGIES = ("auto", "ddp", "fsdp")
FSDP_SHARDINGS = ("full", "hybrid")
# FSDP2 through Fabric's ModelParallelStrategy: fp16 would need a sharded GradScaler
FSDP_PRECISIONS = ("32-true", "64-true", "bf16-mixed", "bf16-true")
CPU_OFFLOAD_NEEDS_CUDA = (
    "trainer.fsdp.cpu_offload=true moves the shards from CUDA devices into CPU memory, but "
    "this run trains on {}: use trainer.accelerator=cuda, or trainer.fsdp.cpu_offload=false"
)


def _check_choice(name: str, value: object, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise ValueError(f"{name}={value!r} is not valid; choose one of: {', '.join(valid)}")


def _check_positive(name: str, value: int | float | None, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if value is None or value < 1:
        raise ValueError(f"{name}={value!r} is not valid; it must be an integer >= 1")


def _check_finite_positive(name: str, value: float | None, null_means: str) -> None:
    # NaN passes `value <= 0` (every comparison with NaN is False): check finiteness too
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ValueError(
            f"{name}={value!r} is not valid; use a finite positive number, or null {null_means}"
        )


@dataclass
class CompileConfig:
    """How ``torch.compile`` is applied to the module before ``fabric.setup``."""

    mode: str = "none"
    """``none`` (eager), ``default``, ``reduce-overhead`` (CUDA graphs), ``max-autotune``,
    ``max-autotune-no-cudagraphs``."""
    backend: str = "inductor"
    """A dynamo backend: ``inductor``, ``aot_eager`` (fast to compile, for tests), ``eager``."""
    fullgraph: bool = False
    """Fail on any graph break instead of falling back to Python."""
    dynamic: bool | None = None
    """``None`` lets dynamo decide (static first, dynamic after a shape changes)."""
    recompile_warn_threshold: int = 8
    """Warn, naming the guard that failed, once the run has recompiled this many times."""
    regional: bool = False
    """Compile each repeated block (the children of an ``nn.ModuleList`` of one class:
    transformer layers, timm blocks) in place instead of the whole module: identical blocks
    share one graph, so compile time does not grow with depth."""
    trace: bool = False
    """Record torch's structured compile trace (``TORCH_TRACE``: what ``tlparse`` reads) of the
    job in its job dir; kiln-train and kiln-bench turn it into a tlparse report there and log
    it to W&B."""
    cache_dir: str | None = None
    """Keep inductor's FX graph and AOTAutograd caches here (switched on for the fit), so
    the jobs of a sweep and re-runs compile each graph once; ``None`` leaves torch's
    settings alone. The telemetry says whether the compile was cold or warm."""

    def __post_init__(self) -> None:
        _check_choice("compile.mode", self.mode, COMPILE_MODES)
        # the annotations are not enforced at run time: a config may hold any value
        if not isinstance(self.backend, str) or not self.backend:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(
                f"compile.backend={self.backend!r} is not valid; name a dynamo backend"
            )
        _check_positive("compile.recompile_warn_threshold", self.recompile_warn_threshold)
        if self.cache_dir is not None and (
            not isinstance(self.cache_dir, str) or not self.cache_dir  # pyright: ignore[reportUnnecessaryIsInstance]
        ):
            raise ValueError(
                f"compile.cache_dir={self.cache_dir!r} is not valid; use a directory path or null"
            )

    @property
    def enabled(self) -> bool:
        return self.mode != "none"

    @property
    def uses_cuda_graphs(self) -> bool:
        """Inductor's modes that capture CUDA graphs (on a CUDA device)."""
        return (
            self.enabled
            and self.backend == "inductor"
            and self.mode in ("reduce-overhead", "max-autotune")
        )

    def torch_compile_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``torch.compile`` (the inductor mode only applies to inductor)."""
        kwargs: dict[str, Any] = {
            "backend": self.backend,
            "fullgraph": self.fullgraph,
            "dynamic": self.dynamic,
        }
        if self.backend == "inductor" and self.mode != "default":
            kwargs["mode"] = self.mode
        return kwargs


@dataclass
class FSDPConfig:
    """FSDP2 options, read with ``trainer.strategy=fsdp`` (docs/sharded-training.md)."""

    reshard_after_forward: bool = True
    """Free each block's gathered parameters after its forward and gather them again for
    the backward (ZeRO-3: least memory); ``false`` keeps them until the backward (ZeRO-2
    like: less communication, more memory)."""
    cpu_offload: bool = False
    """Keep the sharded parameters, gradients and optimizer state in CPU memory and copy
    each block's parameters to the device for its forward and backward (FSDP2's
    ``CPUOffloadPolicy``); the optimizer step runs on the CPU. CUDA only."""
    sharding: str = "full"
    """``full``: shard over every rank. ``hybrid``: shard within a node and replicate
    across nodes (a 2-D device mesh of ``num_nodes x devices``: HSDP)."""

    def __post_init__(self) -> None:
        _check_choice("trainer.fsdp.sharding", self.sharding, FSDP_SHARDINGS)
        for name in ("reshard_after_forward", "cpu_offload"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(
                    f"trainer.fsdp.{name}={getattr(self, name)!r} is not valid; use true or false"
                )


@dataclass
class TrainerConfig:
    """What the Fabric loop does. Steps are optimizer steps (windows of micro-batches).

    ``strategy`` decides how several processes share the work: ``ddp`` (the default for
    several processes) keeps the whole model, its gradients and optimizer state on every
    rank; ``fsdp`` shards all three over the ranks with FSDP2 (``fully_shard`` on each
    repeated block, then the root; options in ``fsdp``). One process trains on one device
    whatever the strategy says; with ``fsdp`` it does so through FSDP2 on a mesh of one rank
    (one shard: nothing is split, the code path and the sharded checkpoint are the same), so
    a sharded checkpoint resumes on one process and one written there resumes on several.
    """

    max_steps: int = 100
    """Optimizer steps to train for; the run stops at max_steps or max_epochs, whichever first."""
    max_epochs: int | None = None
    """Epochs to train for, or ``None`` for no limit (then ``max_steps`` decides)."""
    accumulate_grad_batches: int = 1
    """Micro-batches per optimizer step. The update equals one batch holding all of them."""
    gradient_clip_norm: float | None = None
    """Clip the global gradient norm to this value; ``None`` disables clipping."""
    precision: str = "32-true"
    """Fabric precision: ``32-true``, ``bf16-mixed``, ``16-mixed``, ``bf16-true``, ``64-true``."""
    accelerator: str = "auto"
    """``auto``, ``cpu``, ``cuda``, ``mps``."""
    devices: int = 1
    """Processes (one per device) on this node."""
    num_nodes: int = 1
    """Nodes in the job (multi-node runs are started by torchrun or SLURM)."""
    threads_per_rank: int | str | None = None
    """torch's intra-op threads in each rank, set before its first op whatever started it
    (kiln's launcher, torchrun, SLURM, one process). ``None`` or ``"auto"``: the cores this
    process may use on its node (affinity, cgroup quota, SLURM's CPUs) // (``devices x
    num_nodes``), so the same per-rank work gets the same threads on any layout; an integer
    sets it (``kiln.core.distributed.threads``). Float sums add in another order on another
    count."""
    strategy: str = "auto"
    """``auto`` (``ddp`` when there are several processes, else one device), ``ddp``, or
    ``fsdp`` (FSDP2 sharding through Fabric's ModelParallelStrategy; CPU/gloo and
    CUDA/NCCL; precision ``32-true``, ``64-true``, ``bf16-mixed``, ``bf16-true``)."""
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    """FSDP2 options (``trainer.fsdp.reshard_after_forward``, ``cpu_offload``, ``sharding``)."""
    seed: int = 0
    """Seeds python, numpy and torch on every rank, and the data order."""
    deterministic: bool = False
    """Use deterministic algorithms (needed for bit-exact resume)."""
    val_every_n_steps: int | None = None
    """Validate every N optimizer steps; validation always runs at the end of training."""
    limit_val_batches: int | None = None
    """Validate on at most this many batches per rank (``None``: the whole set)."""
    log_every_n_steps: int = 10
    """Log the training loss every N optimizer steps (each log is a host sync point)."""
    checkpoint_dir: str | None = None
    """Where checkpoints go; ``None`` disables checkpointing."""
    checkpoint_every_n_steps: int | None = None
    """Save every N optimizer steps; with a checkpoint_dir the final step is always saved."""
    keep_last_k: int = 2
    """How many of the newest checkpoints to keep."""
    async_checkpoint: bool | None = None
    """Write periodic checkpoints while training goes on (the state is copied to host memory,
    then written in a thread). ``None``: on CUDA, where the steps leave the CPU to the
    writer; not on the CPU, where the writer competes with the steps for the same cores
    (docs/benchmarks.md, "Checkpoint stall")."""
    resume: str | None = None
    """``None`` (fresh run), ``"auto"`` (newest complete checkpoint in checkpoint_dir, if any),
    or a checkpoint path."""
    allow_changed_state: bool = False
    """Resume a checkpoint whose registered state differs from this run's: a callback's state
    with no callback to take it is dropped, a stateful callback the checkpoint holds nothing
    for starts fresh; the run says which once (``FitResult.changed_state``). ``False``
    refuses such a resume (``StateChangedError``, naming each key)."""
    warmup_steps: int = 3
    """Optimizer steps excluded from the steady-state step time (compilation, caches)."""
    progress: bool = True
    """Show a progress bar on rank 0 (plain log lines when output is not a terminal)."""
    activation_checkpointing: bool = False
    """Recompute each repeated block's activations in the backward instead of keeping them
    (``kiln.core.loop.activation_checkpointing``): less activation memory for about one more
    forward per step; the gradients are the same."""
    count_flops: bool = True
    """Count a micro-batch's FLOPs once (``training_step`` + backward on meta tensors) and
    report ``flops_per_step``, ``achieved_flops_per_s`` and ``mfu`` in the telemetry. A
    module can opt out itself with a ``count_flops = False`` attribute."""
    precision_audit: bool = False
    """Audit the first optimizer step of each attempt: which ops ran in which dtype, in which
    module (``kiln.core.loop.precision_audit``), recorded as the telemetry's
    ``precision_audit``; under ``64-true`` it names every op that ran below float64, under
    ``bf16-mixed`` every matmul that did not run in bf16 (a warning says so). The audited step
    runs eagerly (with compile too) and is the run's own step, not an extra one."""

    machine_sample_s: float | None = 1.0
    """Sample the machine every this many seconds through training, on rank 0
    (``kiln.core.telemetry.sampler``): other processes' CPU, the job's own, and on CUDA the
    SM clock; kept as the telemetry's ``machine_series`` and logged as ``machine/*``.
    ``None`` turns it off."""

    telemetry: bool = True
    """Watch the run (``kiln.core.loop.observers``): step times and throughput, padding, the
    compile watch, memory figures and the machine sampler. ``False`` attaches none of them
    (the progress bar then shows no throughput): the run's telemetry holds only what the loop
    itself knows."""

    def __post_init__(self) -> None:
        _check_positive("trainer.max_steps", self.max_steps)
        _check_finite_positive(
            "trainer.machine_sample_s", self.machine_sample_s, "to sample nothing"
        )
        _check_positive("trainer.max_epochs", self.max_epochs, allow_none=True)
        _check_positive("trainer.accumulate_grad_batches", self.accumulate_grad_batches)
        _check_choice("trainer.precision", self.precision, PRECISIONS)
        _check_choice("trainer.strategy", self.strategy, STRATEGIES)
        if isinstance(self.fsdp, dict):  # from a resolved Hydra config
            self.fsdp = FSDPConfig(**cast(dict[str, Any], self.fsdp))
        if self.strategy == "fsdp":
            self._check_fsdp()
        _check_positive("trainer.devices", self.devices)
        _check_positive("trainer.num_nodes", self.num_nodes)
        self._check_threads()
        _check_positive("trainer.val_every_n_steps", self.val_every_n_steps, allow_none=True)
        _check_positive("trainer.limit_val_batches", self.limit_val_batches, allow_none=True)
        _check_positive("trainer.log_every_n_steps", self.log_every_n_steps)
        _check_positive("trainer.checkpoint_every_n_steps", self.checkpoint_every_n_steps, True)
        _check_positive("trainer.keep_last_k", self.keep_last_k)
        _check_finite_positive(
            "trainer.gradient_clip_norm", self.gradient_clip_norm, "to disable clipping"
        )
        if self.warmup_steps < 0:
            raise ValueError(f"trainer.warmup_steps={self.warmup_steps!r} must be >= 0")
        resume = self.resume  # any value: the annotation is not enforced at run time
        if resume is not None and resume != "auto" and not isinstance(resume, str):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(
                f"trainer.resume={self.resume!r}: use null, 'auto' or a checkpoint path"
            )
        if self.resume == "auto" and self.checkpoint_dir is None:
            raise ValueError("trainer.resume='auto' needs trainer.checkpoint_dir to look in")

    def _check_threads(self) -> None:
        threads = self.threads_per_rank  # any value: the annotation is not enforced at run time
        if threads is None or threads == "auto":
            return
        # bool is an int subclass: true would read as 1
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(
                f"trainer.threads_per_rank={threads!r} is not valid; use an integer >= 1, or "
                "auto (or null) for the cores this process may use // (devices x num_nodes)"
            )

    def _check_fsdp(self) -> None:
        if self.precision not in FSDP_PRECISIONS:
            raise ValueError(
                f"trainer.precision={self.precision!r} is not supported with "
                f"trainer.strategy=fsdp; choose one of: {', '.join(FSDP_PRECISIONS)}"
            )
        if self.fsdp.cpu_offload and self.accelerator in ("cpu", "mps"):
            raise ValueError(CPU_OFFLOAD_NEEDS_CUDA.format(self.accelerator))
        if self.fsdp.sharding == "hybrid" and self.num_nodes < 2:
            raise ValueError(
                "trainer.fsdp.sharding=hybrid shards within a node and replicates across "
                f"nodes: it needs trainer.num_nodes>=2 (got {self.num_nodes}); use "
                "trainer.fsdp.sharding=full on one node"
            )


def check_global_batch(where: str, saved: tuple[int, int, int], now: tuple[int, int, int]) -> None:
    """Refuse a world-size change that does not keep the global batch.

    Args:
        where: What is resumed from where (starts the message).
        saved: The checkpoint's (world size, micro-batch size, accumulation).
        now: This run's.

    Raises:
        ValueError: The products differ; the message names both and the accumulation that
            keeps the global batch (or says that none does).
    """
    global_batch, here = saved[0] * saved[1] * saved[2], now[0] * now[1] * now[2]
    if here == global_batch:
        return
    world, batch = now[0], now[1]
    accumulate, left = divmod(global_batch, world * batch)
    if left == 0:
        works = f"set trainer.accumulate_grad_batches={accumulate} to keep it"
    else:
        works = (
            f"no trainer.accumulate_grad_batches keeps it with micro-batches of {batch} on "
            f"{world} processes; choose a micro-batch size with {world} x batch x "
            f"accumulation = {global_batch}, or resume on the checkpoint's world size"
        )
    raise ValueError(
        f"{where}: its global batch (devices x micro-batch x accumulation) is "
        f"{' x '.join(map(str, saved))} = {global_batch}, this run's "
        f"{' x '.join(map(str, now))} = {here}; {works}"
    )


@dataclass
class ProfileConfig:
    """What :class:`StepProfiler` records (kiln-train's ``profile=steps`` config group).

    Raises:
        ValueError: A step count that is negative, or ``active`` < 1.
    """

    directory: str = "profile"
    """Where the trace (and on CUDA the memory snapshot) go."""
    wait: int = 2
    """Steps to skip first (the first step compiles and counts FLOPs)."""
    warmup: int = 2
    """Steps recorded and dropped before the measured ones."""
    active: int = 3
    """Steps measured."""
    record_shapes: bool = False
    """Record each op's input shapes (a bigger trace)."""
    profile_memory: bool = False
    """Record tensor allocations and frees in the trace."""
    with_stack: bool = False
    """Record Python stacks (a much bigger trace, slower steps)."""
    memory_snapshot: bool = True
    """On CUDA, the allocator's history as a snapshot file."""

    def __post_init__(self) -> None:
        if min(self.wait, self.warmup) < 0 or self.active < 1:
            raise ValueError(
                f"profile steps: wait={self.wait}, warmup={self.warmup}, active={self.active}; "
                "wait and warmup are >= 0 and active >= 1"
            )
