# `make demo` and `make test` do all set-up themselves: a .venv with pinned installs.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DOCS_STAMP := $(VENV)/.docs-installed
# -W: a warning fails the build; --keep-going: all of them are reported first.
SPHINX := $(VENV)/bin/sphinx-build -W --keep-going -q -d docs/_build/doctrees

.PHONY: venv demo test soak lint bench bench-imperative bench-detection bench-losses bench-dist bench-aux bench-isolation \
	bench-residuals bench-port bench-fork bench-binds bench-composed bench-memory bench-native bench-rules dist-demo notebooks docs clean

venv: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt setup.py pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements-dev.txt
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

# The site's tools go into the same .venv (pinned in docs/requirements.txt to agree with
# requirements-dev.txt, pip check clean): autodoc and the doctests then read this checkout
# through its editable install.  `nox -s docs` builds the same from a fresh venv.
$(DOCS_STAMP): $(STAMP) docs/requirements.txt
	$(PY) -m pip install --quiet -r docs/requirements.txt
	$(PY) -m pip check
	touch $(DOCS_STAMP)

# The site (docs/_build/html/index.html, works from disk), then every example on its pages
# and in the docstrings it shows (Sphinx's doctest builder), then docs/check_site.py.
docs: $(DOCS_STAMP)
	$(SPHINX) -b html docs docs/_build/html
	$(SPHINX) -b doctest docs docs/_build/doctest
	$(PY) docs/check_site.py docs/_build/html

demo: $(STAMP)
	$(PY) notebooks/demo.py

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Under 5 minutes on 2 idle cores (docs/development.md, "The suite's time"): two
# pytest-xdist workers, a test module per unit of work (tests/conftest.py puts the slowest
# first).  Tests marked soak (long soaks, and jobs whose checks make test also makes
# elsewhere) run in `make soak`, one at a time, each allowed an hour; so do the benchmark
# scripts' smoke runs (marked benchmarks), which CI's full suites run too.  The Horovod soak
# (a 3,000-step 2-rank job) runs in the `horovod` nox session's venv, where Horovod is built
# (once per machine, cached outside the checkout: noxfile.py).
WORKERS ?= 2
# -rs: the reasons of skipped tests (tests/test_horovod.py's where Horovod is not installed).
test: lint
	$(PY) -m pytest -q -rs -m "not soak and not benchmarks" -n $(WORKERS) --dist loadfile tests

soak: $(STAMP)
	$(PY) -m pytest -q -m "soak or benchmarks" --timeout 3600 tests
	$(VENV)/bin/nox -s horovod -- -q -m soak --timeout 3600 tests/test_horovod.py

notebooks: $(STAMP)
	$(PY) notebooks/run_notebooks.py

bench: $(STAMP)
	$(PY) benchmarks/overhead.py

bench-detection: $(STAMP)
	$(PY) benchmarks/detection.py

bench-losses: $(STAMP)
	$(PY) benchmarks/losses.py

bench-dist: $(STAMP)
	$(PY) benchmarks/dist_aux.py

bench-aux: $(STAMP)
	$(PY) benchmarks/aux_agreement.py

# What each aux merge rule makes of center-loss centers on 2 devices (the aux-states how-to).
bench-rules: $(STAMP)
	$(PY) benchmarks/aux_rules.py --classes 4
	$(PY) benchmarks/aux_rules.py --classes 64

bench-isolation: $(STAMP)
	$(PY) benchmarks/isolation.py

bench-residuals: $(STAMP)
	$(PY) benchmarks/residuals.py

# needs the port extra in .venv: .venv/bin/pip install '.[port]' numpy==1.23.5
bench-port: $(STAMP)
	$(PY) benchmarks/port.py

bench-fork: $(STAMP)
	$(PY) benchmarks/fork_cost.py

bench-binds: $(STAMP)
	$(PY) benchmarks/bind_cost.py
	$(PY) benchmarks/first_steps.py

bench-composed: $(STAMP)
	$(PY) benchmarks/composed.py
	$(PY) benchmarks/composed.py --peak 200

bench-memory: $(STAMP)
	$(PY) benchmarks/memory.py
	$(PY) benchmarks/runahead.py
	$(PY) benchmarks/thread_resources.py

bench-imperative: $(STAMP)
	$(PY) benchmarks/imperative.py

# ONNX Runtime needs numpy>=1.24.2, which MXNet 1.9.1 cannot import: its own venv, for the
# table's information row (tests/deploy/requirements-onnxruntime.txt pins it).
ORT_VENV := .venv-ort
$(ORT_VENV)/.installed: tests/deploy/requirements-onnxruntime.txt
	test -x $(ORT_VENV)/bin/python || $(PYTHON) -m venv $(ORT_VENV)
	$(ORT_VENV)/bin/python -m pip install --quiet -r tests/deploy/requirements-onnxruntime.txt
	touch $@

bench-native: $(STAMP) $(ORT_VENV)/.installed
	$(PY) benchmarks/native_graphs.py --onnxruntime $(ORT_VENV)/bin/python

# Two dist_sync workers + one server on 127.0.0.1, a decorated loss, Gluon's Trainer.
dist-demo: $(STAMP)
	$(PY) -m customop.distributed.launch -n 2 -s 1 --launcher local --timeout 300 \
		$(PY) examples/dist_train.py --api gluon --kvstore dist_sync --center-loss 0.1

clean:
	rm -rf $(VENV) $(ORT_VENV) build *.egg-info docs/_build docs/_generated
