# Two commands: `make demo` and `make test`. Both create .venv themselves.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
SAMPLE ?= sample_traces/chat.jsonl

.PHONY: demo test bench clean

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: $(BIN)/activate pyproject.toml
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

demo: $(VENV)/.installed
	$(BIN)/kvtrace stats $(SAMPLE)

test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q

bench: $(VENV)/.installed-dev
	$(BIN)/python benchmarks/ingest.py

clean:
	rm -rf $(VENV) build *.egg-info analytics/*.egg-info
