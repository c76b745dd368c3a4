#!/usr/bin/env bash
# kiln's GPU check: the CUDA-only kiln-bench paths on a few tiny models, then the report.
#
#   scripts/gpu_check.sh            # on a machine with a CUDA GPU and only this repository
#   scripts/gpu_check.sh suites     # the PyTorch 2 suites' subset instead (see below)
#   scripts/gpu_check.sh all        # both, one after the other
#   scripts/gpu_check.sh quick      # what fits a 15-minute lease (issues 30 and 31's paths)
#   scripts/gpu_check.sh lm         # the causal-LM peers benchmark on CUDA (about 10 minutes)
#
# Covers reduce-overhead (CUDA graphs), 16-mixed (fp16 AMP with its GradScaler), bf16-mixed
# and max-autotune; each job checks loss and gradients against eager. With 2+ GPUs, an FSDP
# row (bf16-mixed, compile=default, kiln-train) next to DDP. Sets up its own
# environment (uv, then `uv sync` from the committed uv.lock) and exits 0 with a message
# when there is no CUDA GPU. Also profiles an eager and a compiled job (profile=steps). Sized
# to finish within 10 minutes on one H200.
# `suites`: 8 HF + 8 TIMM models of PyTorch's dashboard lists at the suite's sizes and batch
# sizes, compile=default against eager (interleaved in each job) at FP32 and fp16 AMP, plus
# reduce-overhead on 2 + 2 of them, then kiln-report's seed table; each sweep has a time
# limit so the whole part ends within 10 minutes, a model that runs out is a missing row.
# Environment: KILN_GPU_CHECK_DIR (output dir), KILN_SKIP_SYNC=1 (use the existing .venv).
# On a machine without network whose python3 already has torch (the lent H200 image):
#   KILN_PYTHON=python3 KILN_WHEELS=.whl scripts/gpu_check.sh
# installs the wheels that scripts/gpu_wheels.sh downloaded elsewhere into /tmp/kiln-site
# and runs kiln from its source folders with that interpreter.
set -uo pipefail
cd "$(dirname "$0")/.."
PART="${1:-core}"
case "$PART" in core|suites|all|quick|lm) ;;
    *) echo "gpu_check: unknown part '$PART'; use core, suites, all, quick or lm"; exit 2;; esac

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_check: no CUDA GPU here (nvidia-smi finds none); skipping"
    exit 0
fi
nvidia-smi -L

export WANDB_MODE="${WANDB_MODE:-offline}" HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
    TOKENIZERS_PARALLELISM=false
if [[ -n "${KILN_PYTHON:-}" ]]; then
    if [[ -n "${KILN_WHEELS:-}" ]]; then
        "$KILN_PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
            --upgrade --target /tmp/kiln-site "$KILN_WHEELS"/*.whl || exit 1
    fi
    export PYTHONPATH="/tmp/kiln-site:packages/core/src:packages/models/src:packages/experiments/src${PYTHONPATH:+:$PYTHONPATH}"
elif [[ "${KILN_SKIP_SYNC:-0}" != 1 ]]; then
    if ! command -v uv >/dev/null 2>&1; then
        python3 -m pip install --quiet uv || python3 -m pip install --quiet --user uv || exit 1
        export PATH="$HOME/.local/bin:$PATH"
    fi
    UV="$(command -v uv || echo "python3 -m uv")"
    $UV sync --frozen --all-packages || { echo "gpu_check: uv sync failed"; exit 1; }
fi
PY="${KILN_PYTHON:-.venv/bin/python}"
status=0
BENCH=("$PY" -m kiln.experiments.bench)
REPORT=("$PY" -m kiln.experiments.report)
if ! $PY -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: torch $($PY -c 'import torch; print(torch.__version__)') sees no CUDA device; skipping"
    exit 0
fi

OUT="${KILN_GPU_CHECK_DIR:-outputs/gpu_check/$(date +%Y-%m-%d_%H-%M-%S)}"

suites() {
    # Small-to-mid models of each list; each sweep stops at its time limit
    # (4 + 4 + 1 + 1 minutes), and the report shows the rows that finished.
    local hf="BertForMaskedLM,DistilBertForQuestionAnswering,GPT2ForSequenceClassification"
    hf+=",T5Small,ElectraForCausalLM,RobertaForCausalLM,DistillGPT2,LayoutLMForSequenceClassification"
    local timm="mobilenetv2_100,deit_tiny_patch16_224.fb_in1k,ghostnet_100,tf_efficientnet_b0"
    timm+=",repvgg_a2,mobilevit_s,convnextv2_nano.fcmae_ft_in22k_in1k,visformer_small"
    local args=(trainer.accelerator=cuda bench.repeats=10 bench.warmup=3 logger=csv)
    timeout 240 "${BENCH[@]}" -m sweep=pt2_hf "model.arch=$hf" compile=default \
        precision=32-true,16-mixed "${args[@]}" "hydra.sweep.dir=$OUT/suites/pt2_hf" || status=$?
    timeout 240 "${BENCH[@]}" -m sweep=pt2_timm "model.arch=$timm" compile=default \
        precision=32-true,16-mixed "${args[@]}" "hydra.sweep.dir=$OUT/suites/pt2_timm" || status=$?
    # CUDA graphs on two of each, AMP
    timeout 50 "${BENCH[@]}" -m sweep=pt2_hf model.arch=BertForMaskedLM,T5Small \
        compile=reduce-overhead precision=16-mixed "${args[@]}" \
        "hydra.sweep.dir=$OUT/suites/pt2_hf_ro" || status=$?
    timeout 50 "${BENCH[@]}" -m sweep=pt2_timm model.arch=mobilenetv2_100,deit_tiny_patch16_224.fb_in1k \
        compile=reduce-overhead precision=16-mixed "${args[@]}" \
        "hydra.sweep.dir=$OUT/suites/pt2_timm_ro" || status=$?
    "${REPORT[@]}" "$OUT/suites" || status=$?
}
if [[ "$PART" == suites ]]; then
    suites
    echo "gpu_check: suites report in $OUT/suites (exit status $status)"
    exit "$status"
fi

# `quick`: the CUDA-only paths of issues 30 and 31 in about 6 minutes (a 15-minute lease). First
# alone, since its timings are read: the profiled eager/compiled pair and its check. Then side
# by side (correctness only): the gpu tests, a profiled fp32/bf16 pair, a packed causal LM
# under compile. Ends with a table of every job's record and one line per part (status,
# seconds); the parts' logs go to $KILN_GPU_CHECK_OUT (default: the output dir).
quick() {
    local logs="${KILN_GPU_CHECK_OUT:-$OUT}"
    mkdir -p "$logs"
    : >"$logs/parts.txt"
    part() {  # part NAME TIMEOUT CMD...: run one part into its log, note status and seconds
        local name=$1 limit=$2 start=$SECONDS rc=0
        shift 2
        timeout "$limit" "$@" >"$logs/$name.log" 2>&1 || rc=$?
        echo "$name rc=$rc $((SECONDS - start))s" >>"$logs/parts.txt"
        tail -n 30 "$logs/$name.log"
        return "$rc"
    }
    part profile 240 "$PY" -m kiln.experiments.train -m debug=fast trainer=gpu \
        precision=bf16-mixed compile=none,default trainer.max_steps=12 \
        trainer.machine_sample_s=0.2 profile=steps logger=csv "hydra.sweep.dir=$OUT/profile" \
        || status=1
    part profile_check 30 "$PY" scripts/check_gpu_profiles.py "$OUT/profile" --jobs 2 || status=1
    part profile_report 60 "${REPORT[@]}" "$OUT/profile" || status=1
    part gpu_tests 200 "$PY" -m pytest -m gpu tests/gpu -q -p no:cacheprovider >/dev/null &
    local tests=$!
    part precision 150 "$PY" -m kiln.experiments.train -m debug=fast trainer=gpu \
        precision=32-true,bf16-mixed compile=none trainer.max_steps=12 \
        trainer.machine_sample_s=0.2 profile=steps logger=csv "hydra.sweep.dir=$OUT/precision" \
        || status=1
    part precision_report 60 "${REPORT[@]}" "$OUT/precision" || status=1
    part packed_lm 180 "$PY" -m kiln.experiments.train experiment=tiny_llama_lm debug=fast \
        trainer=gpu precision=bf16-mixed compile=default data.packing=true \
        trainer.max_steps=30 logger=csv "hydra.run.dir=$OUT/packed_lm" || status=1
    wait "$tests" || status=1
    tail -n 30 "$logs/gpu_tests.log"
    "$PY" scripts/gpu_table.py "$OUT" | tee "$logs/table.txt"
    cat "$logs/parts.txt"
}
if [[ "$PART" == quick ]]; then
    quick
    echo "gpu_check: quick part in $OUT (exit status $status)"
    exit "$status"
fi

# `lm`: issue 31's causal-LM benchmark (scripts/bench_peers_lm.py) on CUDA in bf16 AMP: a corpus
# written from this interpreter's own site-packages (no package index or hub needed), then
# every variant, the peers under the same interpreter. Not run on a GPU yet.
lm() {
    local corpus="$OUT/corpus" purelib
    purelib="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    timeout 180 "$PY" scripts/make_corpus.py --source "$purelib" --out "$corpus" \
        --max-documents 4000 || return 1
    # 10x the CPU default's tokens: a GPU step of this 3M-parameter model takes milliseconds,
    # so a run of 60k tokens would be all start-up and compilation; 7 variants x 2 rounds of
    # 600k tokens should fit the 8 minutes
    KILN_CORPUS="$corpus" timeout 480 "$PY" scripts/bench_peers_lm.py --accelerator cuda \
        --precision bf16-mixed --peer-python "$PY" --rounds 2 --train-tokens 600000 \
        --json "$OUT/lm.json"
}
if [[ "$PART" == lm ]]; then
    lm || status=1
    echo "gpu_check: lm part in $OUT (exit status $status)"
    exit "$status"
fi

# The CUDA-only paths of kiln.core.fit (tests marked gpu): fp16 AMP, CUDA graphs, timing.
timeout 150 "$PY" -m pytest -m gpu tests/gpu -q -p no:cacheprovider || status=$?

COMMON=(trainer.accelerator=cuda bench.repeats=10 bench.warmup=3 bench.batch_size=32
        "hydra.sweep.dir=$OUT")
# 2 models x {default, reduce-overhead} x {16-mixed, bf16-mixed} = 8 jobs
timeout 330 "${BENCH[@]}" -m model=bert-tiny-cls,resnet-tiny \
    compile=default,reduce-overhead precision=16-mixed,bf16-mixed \
    "${COMMON[@]}" 'hydra.sweep.subdir=modes_${hydra.job.num}' || status=$?
# max-autotune (Triton autotuning) on one model, bf16-mixed, plus its fp32 eager control
timeout 150 "${BENCH[@]}" -m model=bert-tiny-cls compile=max-autotune,none \
    precision=bf16-mixed "${COMMON[@]}" 'hydra.sweep.subdir=autotune_${hydra.job.num}' \
    || status=$?
# FSDP through kiln-train (bf16-mixed, compile=default) next to DDP, 2 GPUs, one process each
# (NCCL allows no two ranks on one GPU): the report compares throughput, peak memory and
# per-rank state bytes (speedup_vs_ddp, memory_vs_ddp, state_vs_ddp)
GPUS="$("$PY" -c 'import torch; print(torch.cuda.device_count())')"
if (( GPUS >= 2 )); then
    timeout 300 "$PY" -m kiln.experiments.train -m experiment=tiny_llama_lm debug=fast \
        trainer=gpu trainer.devices=2 trainer.strategy=ddp,fsdp precision=bf16-mixed \
        compile=default trainer.max_steps=40 logger=csv "hydra.sweep.dir=$OUT" \
        'hydra.sweep.subdir=fsdp_${hydra.job.num}' || status=$?
else
    echo "gpu_check: FSDP row skipped: $GPUS CUDA device(s), FSDP needs 2 (one process each)"
fi
# Profiles on CUDA: one eager and one compiled kiln-train job (profile=steps), the machine
# sampled every 0.2 s, then a check of what only CUDA gives (scripts/check_gpu_profiles.py):
# kernels per step, the kernels' time by category, the memory snapshot, the SM-clock series
# and its throttle reasons; kiln-report of that sweep prints the two breakdowns side by side.
timeout 240 "$PY" -m kiln.experiments.train -m debug=fast trainer=gpu precision=bf16-mixed \
    compile=none,default trainer.max_steps=12 trainer.machine_sample_s=0.2 profile=steps \
    logger=csv "hydra.sweep.dir=$OUT/profile" || status=$?
"$PY" scripts/check_gpu_profiles.py "$OUT/profile" --jobs 2 || status=$?
"${REPORT[@]}" "$OUT/profile" || status=$?
"${REPORT[@]}" "$OUT" || status=$?
[[ "$PART" == all ]] && suites
echo "gpu_check: report in $OUT (exit status $status: non-zero when a job failed or timed out)"
exit "$status"
