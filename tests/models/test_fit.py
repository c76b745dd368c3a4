"""Through kiln.core's loop: static shapes under compile (the one-step fit of every model
is the test kit's, ``test_models.py``)."""

from functools import partial

import torch
from trainers import trainer_config

from kiln.core import CompileConfig, fit
from kiln.models.testing import tiny_model

_trainer = partial(trainer_config, max_steps=1, limit_val_batches=1)


def test_compiled_model_sees_no_recompiles_over_an_epoch_of_variable_length_text():
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    module = tiny_model("bert-tiny-cls", data=True)  # generated rows: 7 to 21 tokens
    loader = module.data_module.train_dataloader()
    counter = CompileCounter()
    step = torch.compile(module.training_step, backend=counter)
    for batch in loader:
        step(batch, 0)["loss"].backward()
    assert len(loader) == 8 and counter.frame_count == 1  # one graph, never recompiled
    module.eval()
    validate = torch.compile(module.validation_step, backend=counter)
    with torch.no_grad():
        for batch in module.data_module.val_dataloader():
            validate(batch, 0)
    assert counter.frame_count == 2  # one more graph for the whole validation set


def test_recompiles_reported_by_kiln_core_with_default_padding():
    """Through kiln.core: training compiles once, validation (eval mode) once more, and no
    epoch or validation pass after the first adds a graph."""
    torch._dynamo.reset()
    module = tiny_model("bert-tiny-cls", data=True)
    result = fit(
        module,
        trainer=_trainer(max_steps=100, max_epochs=2, val_every_n_steps=4, limit_val_batches=None),
        compile_config=CompileConfig(mode="default", backend="aot_eager"),
    )
    assert result.global_step == 16  # two epochs of 64 rows in batches of 8
    telemetry = result.telemetry
    assert telemetry["recompiles"] == 1, telemetry  # the eval-mode graph, compiled once
    assert telemetry["validation_recompiles"] == 1, telemetry  # ... while validating
    assert telemetry["graph_breaks"] == 0, telemetry
