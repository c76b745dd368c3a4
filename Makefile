# kiln: two commands on a fresh machine with Python 3.11+ and pip.
#   make train   the embedded default run (packaged MiniLM on kiln's generated text, CPU)
#   make test    the fast tier of the test suite (its time: docs/development.md)
#   make test-all  the full tier: + real-process and SLURM tests (what CI runs)
#   make bench   a small compile x precision benchmark sweep on the CPU, and its report
#   make test-slurm  start a local two-node SLURM cluster (root), then the `slurm` tests
#   make test-crash  kill a job at every write of its record, re-run it, compare the record
# Both install what they need first (uv itself included) from the committed uv.lock.

PYTHON ?= python3
UV := $(shell command -v uv 2>/dev/null || echo "$(PYTHON) -m uv")
RUN := $(UV) run --frozen --all-packages
STAMP := .venv/.kiln-synced
ARGS ?=

export WANDB_MODE ?= offline
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

BENCH_DIR := outputs/bench/$(shell date +%Y-%m-%d_%H-%M-%S)

.PHONY: setup train test test-all test-slow test-slurm test-crash bench lint format clean

# `make test-all` runs the `slurm` tests too when a SLURM cluster answers (CI starts one).
SLURM_UP = $(shell scripts/slurm_local.sh status >/dev/null 2>&1 && echo 1)

setup: $(STAMP)

$(STAMP): uv.lock pyproject.toml packages/core/pyproject.toml packages/models/pyproject.toml packages/experiments/pyproject.toml packages/core/src/kiln/core/__about__.py
	@command -v uv >/dev/null 2>&1 || $(PYTHON) -m uv --version >/dev/null 2>&1 || \
		$(PYTHON) -m pip install --quiet uv || $(PYTHON) -m pip install --quiet --user uv
	$(UV) sync --frozen --all-packages --compile-bytecode
	@touch $@

train: setup
	$(RUN) kiln-train $(ARGS)

# The fast tier runs on pytest-xdist workers (one per core, at most 4; a test module's tests
# share one worker, so its module-scoped fixtures train once). XDIST= runs it in one process.
XDIST ?= -n auto --maxprocesses=4 --dist loadscope
FAST := not slow and not gpu and not process and not slurm and not long
# what the xdist workers run in make test-all: the fast tier and the `long` in-process cases
IN_PROCESS := not slow and not gpu and not process and not slurm

# Each tier's JUnit XML goes to outputs/tests/; scripts/test_budget.py prints its time
# against its budget (docs/development.md) and the slowest tests, whatever the outcome.
JUNIT := outputs/tests
BUDGET := $(RUN) python scripts/test_budget.py

# The fast tier: every guarantee at least once, in-process where the process is not the point.
test: setup
	@mkdir -p $(JUNIT)
	$(RUN) pytest $(XDIST) -m "$(FAST)" --junitxml=$(JUNIT)/fast.xml $(ARGS); \
		status=$$?; $(BUDGET) fast=$(JUNIT)/fast.xml; exit $$status

# The full tier: the fast tier with the `long` in-process cases, then (one at a time: they
# time signals and share the SLURM cluster) the tests whose point is a real process (signals,
# SIGKILL, exit codes, worker launches) and, when a cluster answers, SLURM's. `.ci/run` calls it.
test-all: setup
	@mkdir -p $(JUNIT)
	$(RUN) pytest $(XDIST) -m "$(IN_PROCESS)" --junitxml=$(JUNIT)/in-process.xml $(ARGS)
	$(RUN) pytest -m "(process or slurm) and not slow and not gpu$(if $(SLURM_UP),, and not slurm)" \
		--junitxml=$(JUNIT)/process.xml $(ARGS); \
		status=$$?; $(BUDGET) in-process=$(JUNIT)/in-process.xml process=$(JUNIT)/process.xml; \
		exit $$status

# Multi-minute launches and compiles; GPU tests skip themselves without a GPU.
test-slow: setup
	$(RUN) pytest -m "slow or gpu" $(ARGS)

test-slurm: setup
	scripts/slurm_local.sh --nodes 2
	$(RUN) pytest -m slurm $(ARGS)

# Crash points: a job killed at every occurrence of every kind of write of its record (SIGKILL
# and SIGTERM), re-run, and compared with an uninterrupted run; make test-all covers the first
# and last of each kind (tests/experiments/test_crash_points.py).
test-crash: setup
	$(RUN) python tests/experiments/crash_points.py outputs/crash/$(shell date +%Y-%m-%d_%H-%M-%S) --every $(ARGS)

# The leading '-' lets the report run when a job failed: the sweep then exits 1, and the
# failure is a row of the table with its reason.
bench: setup
	-$(RUN) kiln-bench -m model=bert-tiny-cls,llama-tiny-lm,vit-tiny compile=none,default \
		precision=32-true,bf16-mixed hydra.sweep.dir=$(BENCH_DIR) $(ARGS)
	$(RUN) kiln-report $(BENCH_DIR)

# basedpyright: strict on kiln.core, standard elsewhere; the errors that predate it are listed
# in .basedpyright/baseline.json (only new ones fail; fixed ones leave it with --writebaseline)
lint: setup
	$(RUN) ruff check .
	$(RUN) ruff format --check .
	$(RUN) basedpyright

format: setup
	$(RUN) ruff format .
	$(RUN) ruff check --fix .

clean:
	rm -rf outputs multirun .pytest_cache .ruff_cache
