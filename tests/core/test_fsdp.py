"""``trainer.strategy=fsdp``: FSDP2 shards parameters, gradients and optimizer state over
2 gloo ranks, and accumulation stays exact: in float64 the weights after 5 AdamW steps
equal a plain single-process big-batch loop to <= 1e-12 (1, 2, 4 micro-batches, a partial
last window, unequal token counts per rank, and with clipping of the global norm)."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from toy import ToyBlocksModule, ToyTokenModule, full_weights, reference_run

from kiln.core import CompileConfig, TrainerConfig, fit, launch
from kiln.core.callbacks import EMA

EXACT = dict(rtol=0.0, atol=1e-12)
MODULE_KW = dict(n=40, batch_size=2, lr=0.01, optimizer="adamw")
# (accumulate, clip): 40 samples = 10 micro-batches of 2 per rank and epoch, so windows of
# 4 are [4, 4, 2] per epoch: the third step is a partial window
CASES = [(1, None), (2, None), (4, None), (2, 0.05)]


def window_samples(accumulate: int, steps: int = 5, ranks: int = 2) -> list[int]:
    """Samples (both ranks) in each of the first ``steps`` windows, partial ones included."""
    per_epoch = MODULE_KW["n"] // (MODULE_KW["batch_size"] * ranks)
    sizes = []
    while len(sizes) < steps:
        left = per_epoch
        while left and len(sizes) < steps:
            take = min(accumulate, left)
            sizes.append(take * MODULE_KW["batch_size"] * ranks)
            left -= take
    return sizes


class ShardProbe:
    """Records what each rank holds: its parameter, gradient and optimizer-state shards,
    and whether a micro-batch's backward left reduced (sharded) gradients behind."""

    def __init__(self) -> None:
        self.optimizer = None
        self.grads_after_backward: list[bool] = []  # any .grad set after each micro-batch
        self.grad_shapes: dict[str, tuple] = {}

    def on_loop_start(self, loop) -> None:
        self.module, self.optimizer = loop.module, loop.optimizer

    def on_after_backward(self) -> None:
        self.grads_after_backward.append(any(p.grad is not None for p in self.module.parameters()))

    def on_before_optimizer_step(self, optimizer) -> None:
        if not self.grad_shapes:
            self.grad_shapes = {
                n: tuple(p.grad.to_local().shape) for n, p in self.module.named_parameters()
            }

    def shards(self) -> dict:
        state = self.optimizer.state
        return {
            "params": {
                n: (tuple(p.to_local().shape), tuple(p.shape), type(p).__name__)
                for n, p in self.module.named_parameters()
            },
            "grads": self.grad_shapes,
            "exp_avg": {
                n: tuple(state[p]["exp_avg"].to_local().shape)
                for n, p in self.module.named_parameters()
            },
            "grads_after_backward": self.grads_after_backward,
        }


def fsdp_trainer(**kw) -> TrainerConfig:
    return TrainerConfig(
        **{
            "accelerator": "cpu",
            "devices": 2,
            "strategy": "fsdp",
            "precision": "64-true",
            "max_steps": 5,
            "log_every_n_steps": 1,
            "progress": False,
            **kw,
        }
    )


def exact_runs(cases: list[tuple[int, float | None]]) -> dict:
    """One rank's fits of every case (top-level: spawned ranks import it)."""
    out = {}
    for accumulate, clip in cases:
        module, probe = ToyBlocksModule(**MODULE_KW), ShardProbe()
        trainer = fsdp_trainer(accumulate_grad_batches=accumulate, gradient_clip_norm=clip)
        result = fit(module, trainer, callbacks=[probe])
        out[(accumulate, clip)] = {
            "weights": full_weights(module),
            "history": result.history,
            "shards": probe.shards(),
            "telemetry": result.telemetry,
        }
    # in the same launch: each launch costs seconds of start-up
    out["options"] = option_runs()
    out["no_blocks"] = no_blocks_run()
    try:
        fit(ToyBlocksModule(**MODULE_KW), fsdp_trainer(max_steps=1), callbacks=[EMA()])
        out["ema"] = "no error"
    except ValueError as error:
        out["ema"] = str(error)
    return out


class DtypeProbe(ToyBlocksModule):
    """Records the dtype a block computes with (FSDP2's gathered parameter) and the
    sharded master weight's and gradient's dtypes at the optimizer step."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.seen: dict = {}
        # inside the block's forward its parameters are gathered, in FSDP's param_dtype
        self.blocks[0].linear.register_forward_hook(self._record)

    def _record(self, linear, args, output) -> None:
        self.seen["compute"] = linear.weight.dtype

    def on_before_optimizer_step(self, optimizer) -> None:
        weight = self.blocks[0].linear.weight
        self.seen.update(master=weight.dtype, grad=weight.grad.dtype, kind=type(weight).__name__)


def option_runs() -> dict:
    """Precision and trainer.fsdp options, two steps each."""
    out = {}
    options = {
        "bf16-mixed": dict(precision="bf16-mixed"),
        "bf16-true": dict(precision="bf16-true"),
        "32-true": dict(precision="32-true"),
        "no-reshard": dict(precision="32-true", fsdp={"reshard_after_forward": False}),
    }
    for name, kw in options.items():
        module = DtypeProbe(**MODULE_KW)
        result = fit(module, fsdp_trainer(max_steps=2, gradient_clip_norm=1.0, **kw))
        finite = all(math.isfinite(row["train/loss"]) for row in result.history)
        out[name] = {**module.seen, "step": result.global_step, "finite": finite}
    return out


def hybrid_layout() -> dict:
    """One of 4 gloo ranks, as 2 "nodes" of 2 devices: how ``trainer.fsdp.sharding=hybrid``
    lays a block's weight out on Fabric's flat mesh of 4, and that weight after one SGD step
    on this rank's own tokens (top-level: spawned ranks import it)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from kiln.core.config import FSDPConfig
    from kiln.core.distributed.sharding import shard_module

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (4, 1), mesh_dim_names=("data_parallel", "tensor_parallel"))
    module = shard_module(
        ToyBlocksModule(**MODULE_KW), mesh, FSDPConfig(sharding="hybrid"), "32-true", 2
    )
    weight = module.blocks[0].linear.weight
    out = {
        "mesh": weight.device_mesh.mesh_dim_names,
        "placements": [type(p).__name__ for p in weight.placements],
        "shard_with": weight.device_mesh["shard"].mesh.tolist(),
        "replicate_with": weight.device_mesh["replicate"].mesh.tolist(),
        "full": weight.full_tensor().detach().clone(),
        "before": weight.to_local().detach().clone(),
    }
    ids = torch.randint(1, 11, (2, 8), generator=torch.Generator().manual_seed(dist.get_rank()))
    module(ids).square().mean().backward()
    torch.optim.SGD(module.parameters(), lr=0.1).step()
    out["after"] = weight.to_local().detach().clone()
    dist.destroy_process_group()
    return out


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    """Both ranks' results of every case, from one 2-process launch."""
    return launch(exact_runs, 2, CASES)


@pytest.mark.parametrize(("accumulate", "clip"), CASES)
def test_fsdp_accumulation_equals_one_big_batch_in_float64(ranks, accumulate, clip) -> None:
    want, losses = reference_run(ToyBlocksModule(**MODULE_KW), window_samples(accumulate), clip)
    for rank in ranks:
        got = rank[(accumulate, clip)]
        assert got["weights"].keys() == want.keys()
        for key, value in want.items():
            assert got["weights"][key].dtype == torch.float64
            torch.testing.assert_close(got["weights"][key], value, **EXACT)
        logged = [row["train/loss"] for row in got["history"]]
        assert logged == pytest.approx(losses, rel=0.0, abs=1e-12)
        if clip is not None:  # the global norm, the same on both ranks, above the limit
            norms = [row["train/grad_norm"] for row in got["history"]]
            assert min(norms) > clip
    if clip is not None:
        norms = [
            [r["train/grad_norm"] for r in rank[(accumulate, clip)]["history"]] for rank in ranks
        ]
        assert norms[0] == norms[1]


def test_parameters_gradients_and_optimizer_state_are_sharded(ranks) -> None:
    by_rank = [rank[(2, None)]["shards"] for rank in ranks]
    for name, (_, full, kind) in by_rank[0]["params"].items():
        assert kind == "DTensor", name
        # FSDP2 shards dim 0 as torch.chunk does: rank 0 holds ceil(rows / 2)
        rows = [shards["params"][name][0][0] for shards in by_rank]
        assert rows == [(full[0] + 1) // 2, full[0] // 2], name
        for shards in by_rank:
            local = shards["params"][name][0]
            assert local[1:] == full[1:]
            assert shards["grads"][name] == local, name
            assert shards["exp_avg"][name] == local, name


def test_gradients_are_reduced_on_the_windows_last_micro_batch_only(ranks) -> None:
    # accumulate 4: windows of 4, 4, 2, 4, 4 micro-batches; FSDP2 keeps the unreduced
    # gradients to itself until the reduce-scatter, which sets the sharded .grad
    for rank in ranks:
        flags = rank[(4, None)]["shards"]["grads_after_backward"]
        windows = [4, 4, 2, 4, 4]
        want = [j == n - 1 for n in windows for j in range(n)]
        assert flags == want


def no_blocks_run() -> dict:
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logging.getLogger("kiln.core.distributed.sharding").addHandler(handler)
    module = ToyTokenModule(**MODULE_KW)
    result = fit(module, fsdp_trainer(max_steps=2))
    params = {n: tuple(p.to_local().shape) for n, p in module.named_parameters()}
    return {"messages": records, "step": result.global_step, "params": params}


def test_each_rank_reports_about_half_of_the_models_state_bytes(ranks) -> None:
    """Memory telemetry counts this rank's local shards: about half of what one process
    holds (tests/core/test_memory_telemetry.py: one process counts the whole model exactly)."""
    params = sum(p.numel() for p in ToyBlocksModule(**MODULE_KW).parameters())
    whole = {"param_bytes": 8 * params, "grad_bytes": 8 * params}  # float64
    whole["optimizer_state_bytes"] = 2 * whole["param_bytes"]  # AdamW: exp_avg, exp_avg_sq
    for name, full in whole.items():
        got = [rank[(1, None)]["telemetry"][name] for rank in ranks]
        # dim-0 chunks: an odd dimension makes rank 0's shard a row longer, plus padding;
        # the optimizer's per-tensor step counts come on top
        assert all(0.45 * full < g < 0.6 * full for g in got), (name, full, got)
        assert sum(got) >= full


def test_a_module_without_repeated_blocks_is_sharded_as_one_unit_and_says_so(ranks) -> None:
    for rank in (r["no_blocks"] for r in ranks):
        assert rank["step"] == 2
        assert any("has no repeated blocks" in m and "one unit" in m for m in rank["messages"])
        assert rank["params"]["embed.weight"][0] < 11  # still sharded at rest


def compiled_runs() -> dict:
    """Whole-model and regional compile under FSDP, one after the other on each rank."""
    out = {}
    for regional in (False, True):
        module = ToyBlocksModule(**MODULE_KW)
        compile_config = CompileConfig(mode="default", backend="aot_eager", regional=regional)
        result = fit(module, fsdp_trainer(max_steps=3, precision="32-true"), compile_config)
        out[regional] = {"telemetry": result.telemetry, "step": result.global_step}
    return out


@pytest.fixture(scope="module")
def compiled() -> list[dict]:
    return launch(compiled_runs, 2)


@pytest.mark.long  # one 2-rank launch that compiles twice: about 30 s
@pytest.mark.parametrize("regional", [False, True])
def test_compile_with_fsdp_trains_and_reports_graph_breaks_and_recompiles(
    compiled, regional
) -> None:
    for rank in compiled:
        got = rank[regional]
        assert got["step"] == 3
        telemetry = got["telemetry"]
        for key in ("graph_breaks", "recompiles", "unique_graphs", "compile_time_s"):
            assert isinstance(telemetry[key], int | float), key
        assert telemetry["unique_graphs"] >= 1 and telemetry["compile_time_s"] > 0
        assert telemetry["compiled_blocks"] == (2 if regional else 0)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (dict(devices=2, precision="16-mixed"), r"16-mixed.*not supported with.*fsdp"),
        (dict(devices=2, fsdp={"sharding": "half"}), r"trainer.fsdp.sharding='half'.*full, hybrid"),
        (dict(devices=2, fsdp={"sharding": "hybrid"}), r"hybrid.*num_nodes>=2"),
        (dict(devices=2, fsdp={"cpu_offload": "yes"}), r"trainer.fsdp.cpu_offload='yes'"),
        (dict(devices=2, fsdp={"cpu_offload": True}), r"cpu_offload=true .* trains on cpu"),
        (dict(strategy="fsdp2"), r"trainer.strategy='fsdp2' is not valid.*auto, ddp, fsdp"),
    ],
)
def test_bad_fsdp_settings_fail_before_training_saying_what_is_valid(kw, match) -> None:
    kw = {"strategy": "fsdp", "accelerator": "cpu", **kw}
    with pytest.raises(ValueError, match=match):
        TrainerConfig(**kw)


@pytest.mark.parametrize(
    ("name", "compute", "master"),
    [
        # bf16 compute and gather, fp32 master weights, gradients and optimizer state
        ("bf16-mixed", torch.bfloat16, torch.float32),
        ("bf16-true", torch.bfloat16, torch.bfloat16),
        ("32-true", torch.float32, torch.float32),
        ("no-reshard", torch.float32, torch.float32),
    ],
)
def test_precision_and_fsdp_options_train(ranks, name, compute, master) -> None:
    for rank in ranks:
        seen = rank["options"][name]
        assert seen["step"] == 2 and seen["finite"]
        assert seen["kind"] == "DTensor"
        assert (seen["compute"], seen["master"], seen["grad"]) == (compute, master, master)


@pytest.mark.process  # a 4-rank launch: 2 nodes of 2 devices, so each node has a shard to split
def test_hybrid_sharding_replicates_across_nodes_and_shards_within_one() -> None:
    ranks = launch(hybrid_layout, 4)
    for rank, got in enumerate(ranks):
        assert got["mesh"] == ("replicate", "shard")
        assert got["placements"] == ["Replicate", "Shard"]
        node, device = divmod(rank, 2)  # a node's ranks are consecutive, as SLURM's tasks
        assert got["shard_with"] == [2 * node, 2 * node + 1]
        assert got["replicate_with"] == [device, device + 2]
        # this device's half of the rows, the same half on either node
        half = got["full"][8 * device : 8 * (device + 1)]
        assert got["before"].shape == (8, 16) and torch.equal(got["before"], half)
        # each rank stepped on its own tokens: the replicas stay equal only when the gradients
        # are reduced across the nodes too
        assert not torch.equal(got["after"], got["before"])
        torch.testing.assert_close(got["after"], ranks[(rank + 2) % 4]["after"])


def test_fsdp_on_one_process_trains_on_a_mesh_of_one_rank_and_says_so(tmp_path, caplog) -> None:
    """Documented behaviour (was a refusal): one shard, the same updates as one device, a
    sharded checkpoint, and no launcher environment left behind in this process."""
    from kiln.core.distributed.launch import launched_externally

    module, plain = ToyBlocksModule(**MODULE_KW), ToyBlocksModule(**MODULE_KW)
    with caplog.at_level(logging.INFO, logger="kiln.core.distributed.sharding"):
        result = fit(module, fsdp_trainer(devices=1, max_steps=3, checkpoint_dir=str(tmp_path)))
    assert result.global_step == 3
    assert "trainer.strategy=fsdp on one process: a mesh of one rank shards nothing" in caplog.text
    weight = module.blocks[0].linear.weight
    assert type(weight).__name__ == "DTensor" and weight.device_mesh.size() == 1
    assert tuple(weight.to_local().shape) == (16, 16)  # one whole shard
    checkpoint = tmp_path / "step-00000003.ckpt"
    assert sorted(p.name for p in checkpoint.iterdir()) == [
        ".metadata", "__0_0.distcp", "checksums.json", "meta.pt"
    ]  # fmt: skip
    assert not launched_externally()  # a later launch(fn, 2) still starts its processes
    fit(plain, fsdp_trainer(devices=1, max_steps=3, strategy="auto"))
    for key, value in full_weights(plain).items():
        torch.testing.assert_close(full_weights(module)[key], value, **EXACT, msg=key)


def test_blocks_wrapped_for_activation_checkpointing_are_still_the_blocks_to_shard() -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    from kiln.core.blocks import repeated_blocks

    module = ToyBlocksModule(blocks=3, **MODULE_KW)
    module.blocks = torch.nn.ModuleList(checkpoint_wrapper(b) for b in module.blocks)
    assert repeated_blocks(module) == list(module.blocks)


def test_the_ema_callback_refuses_sharded_parameters_before_training(ranks) -> None:
    for rank in ranks:
        assert "EMA callback averages whole parameters" in rank["ema"]
        assert "trainer.strategy=fsdp shards them" in rank["ema"]
