# Two commands: `make demo` and `make test`. Both create .venv themselves.
# `make test` is the full suite (what CI runs); `make test-fast` the developers' lane (a few minutes).
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
SAMPLE ?= sample_traces/chat.jsonl

.PHONY: demo test test-fast bench clean

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# the demo writes an HTML chart: the png extra (vl-convert-python) renders it
# byte-compiled as a wheel install is (commands start faster where bytecode is not written)
$(VENV)/.installed: $(BIN)/activate pyproject.toml
	$(BIN)/pip install --quiet -e '.[png]'
	$(BIN)/python -m compileall -q analytics/kvtrace
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

# Deselects the tests marked slow, subprocess, nojit, browser and large (tests/conftest.py).
FAST = not (slow or subprocess or nojit or browser or large)
test-fast: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q -m '$(FAST)'

bench: $(VENV)/.installed-dev
	$(BIN)/python benchmarks/ingest.py --keep
	$(BIN)/python benchmarks/curve.py --keep
	$(BIN)/python benchmarks/e2e.py --keep
	$(BIN)/python benchmarks/engine.py --keep
	$(BIN)/python benchmarks/scenario.py --keep
	$(BIN)/python benchmarks/whatif.py --keep
	$(BIN)/python benchmarks/load.py --keep
	$(BIN)/python benchmarks/hashing.py
	$(BIN)/python benchmarks/app.py --browser
	$(BIN)/python benchmarks/table.py

clean:
	rm -rf $(VENV) build *.egg-info analytics/*.egg-info
