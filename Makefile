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

# The main job on the bundled sample: capacity-hit curves, a table, the data and a chart.
demo: $(VENV)/.installed
	mkdir -p out
	$(BIN)/kvtrace stats $(SAMPLE)
	$(BIN)/kvtrace curve $(SAMPLE) --out out/curve.parquet --plot out/curve.html

test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q

bench: $(VENV)/.installed-dev
	$(BIN)/python benchmarks/ingest.py
	$(BIN)/python benchmarks/curve.py

clean:
	rm -rf $(VENV) build *.egg-info analytics/*.egg-info
