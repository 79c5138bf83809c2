# `make demo` and `make test` do all set-up themselves: a .venv with pinned installs.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv demo test lint bench bench-detection bench-losses notebooks clean

venv: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements-dev.txt
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

demo: $(STAMP)
	$(PY) notebooks/demo.py

lint: $(STAMP)
	$(VENV)/bin/ruff check .

test: lint
	$(PY) -m pytest -q tests

notebooks: $(STAMP)
	$(PY) notebooks/run_notebooks.py

bench: $(STAMP)
	$(PY) benchmarks/overhead.py

bench-detection: $(STAMP)
	$(PY) benchmarks/detection.py

bench-losses: $(STAMP)
	$(PY) benchmarks/losses.py

clean:
	rm -rf $(VENV) build *.egg-info
