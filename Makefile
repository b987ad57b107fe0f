# The two set-up commands: `make run` (train on the built-in data, then sample) and `make test`.
PYTHON ?= python3
VENV ?= .venv
# Pinned so that a fresh machine (and CI) takes the CPU build instead of a multi-GB CUDA one.
TORCH_SPEC ?= torch==2.13.0
PRESET ?= cpu
RUNS ?= runs
# Evaluated once (:=): the name `make run` trains into; $(RUNS)/latest points to the newest run.
RUN_DIR := $(RUNS)/$(PRESET)-$(shell date +%Y%m%d-%H%M%S)
TRAIN_ARGS ?=
BIN := $(VENV)/bin

.PHONY: run test install install-test system-deps docs-images bench lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e .

install-test: $(BIN)/python
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[test]"

# Tesseract (OCR of images) and Chromium (the page's browser tests) come from Debian;
# installed when missing and we may use apt-get.
system-deps:
	@command -v tesseract >/dev/null 2>&1 || { \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      tesseract-ocr tesseract-ocr-eng >/dev/null; \
	  else echo "note: install tesseract-ocr for OCR (e.g. sudo apt-get install tesseract-ocr)"; fi; }
	@# Chromium: the tests drive the page of `sheepop serve` in it (Playwright, no browser download).
	@command -v chromium >/dev/null 2>&1 || { \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      chromium >/dev/null; \
	  else echo "note: install chromium for the page's browser tests (e.g. sudo apt-get install chromium)"; fi; }

# runs/latest is pointed at the run before it starts, so that it can be followed while it trains.
run: install
	@mkdir -p $(RUNS) && ln -sfn $(notdir $(RUN_DIR)) $(RUNS)/latest
	@# Training's summary, a sample (--sample: what `sheepop generate RUN --prompt "def "` writes),
	@# then the commands to go on ("next:"), once, last.
	$(BIN)/sheepop train --preset $(PRESET) --out $(RUN_DIR) --sample "def " $(TRAIN_ARGS)
	@echo
	@echo "the run: $(RUN_DIR) (and $(RUNS)/latest); for the commands after \"next:\" above, first . $(BIN)/activate"

# Two workers, each test file on one of them (its module fixtures, e.g. transformers' copy of
# SmolLM2, load once): the suite's real-model and subprocess tests wait on I/O and other
# processes, so on CI's 2 cores this takes 8.5 minutes against 13 in one process.
TEST_WORKERS ?= 2
test: install-test system-deps
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile

lint: install-test
	$(BIN)/ruff check src tests benchmarks

bench: install
	$(BIN)/python benchmarks/train_throughput.py
	$(BIN)/python benchmarks/generate_speed.py

docs-images: install
	$(BIN)/python docs/make_images.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache
