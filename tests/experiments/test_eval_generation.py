"""kiln-eval scores a seq2seq model's generated text (exact match, sacreBLEU, chrF) beside
its teacher-forced metrics, equal to plain transformers ``generate`` scored by sacrebleu."""

from __future__ import annotations

import json

import pytest
import sacrebleu
import torch
from export_helpers import kiln
from train_helpers import FAST, explain, job_dirs, run_train

from kiln.experiments.jobs.trained_model import load_trained_module, resolve_checkpoint
from kiln.models.data.base import IGNORE_INDEX
from kiln.models.metrics import load_metric


def test_generated_text_scores_are_sacrebleu_s_and_exact_match_is_a_fraction():
    predictions = ["the cat sat on the mat", "a dog ", "hello there"]
    references = ["the cat sat on the mat", "a dog", "general kenobi"]
    scores = load_metric("generated_text").compute(predictions=predictions, references=references)
    assert scores["exact_match"] == pytest.approx(2 / 3)
    assert scores["bleu"] == sacrebleu.corpus_bleu(predictions, [references]).score
    assert scores["chrf"] == sacrebleu.corpus_chrf(predictions, [references]).score


def test_kiln_eval_scores_generated_text_as_plain_generate_does(tmp_path):
    proc = run_train(
        ["model=t5-tiny-seq2seq", "data=reverse", *FAST,
         "trainer.checkpoint_dir=${paths.output_dir}/checkpoints"],
        tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, explain(proc)
    (job,) = job_dirs(tmp_path)
    proc = kiln("eval", job, "--limit-batches", 1, "--wandb-mode", "disabled")
    assert proc.returncode == 0, explain(proc)
    metrics = json.loads((job.parent / f"{job.name}-eval" / "eval.json").read_text())["metrics"]
    assert {"val/exact_match", "val/accuracy"} <= set(metrics)  # teacher-forced, as trained

    # the reference: transformers' generate on the first validation batch, decoded, scored
    module, _ = load_trained_module(resolve_checkpoint(job))
    batch = next(iter(module.val_dataloader()))
    real = batch["labels"][:, 0] != IGNORE_INDEX
    with torch.no_grad():
        ids = module.model.generate(
            input_ids=batch["input_ids"][real], attention_mask=batch["attention_mask"][real],
            max_new_tokens=module.data_module.max_target_length, do_sample=False, num_beams=1,
        )  # fmt: skip
    tok = module.tokenizer
    labels = batch["labels"][real]
    predictions = tok.batch_decode(ids, skip_special_tokens=True)
    references = tok.batch_decode(
        labels.masked_fill(labels == IGNORE_INDEX, tok.pad_token_id), skip_special_tokens=True
    )
    exact = sum(p.strip() == r.strip() for p, r in zip(predictions, references, strict=True))
    assert metrics["val/generated_exact_match"] == pytest.approx(exact / len(references))
    bleu = sacrebleu.corpus_bleu(predictions, [references]).score
    assert metrics["val/generated_bleu"] == pytest.approx(bleu)
    chrf = sacrebleu.corpus_chrf(predictions, [references]).score
    assert metrics["val/generated_chrf"] == pytest.approx(chrf)
