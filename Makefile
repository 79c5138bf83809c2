# `make demo` and `make test` do all set-up themselves: a .venv with pinned installs.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv demo test soak lint bench bench-detection bench-losses bench-dist bench-aux bench-isolation \
	bench-residuals bench-fork bench-composed dist-demo notebooks clean

venv: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt setup.py pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements-dev.txt
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

demo: $(STAMP)
	$(PY) notebooks/demo.py

lint: $(STAMP)
	$(VENV)/bin/ruff check .

test: lint
	$(PY) -m pytest -q -m "not soak" tests

soak: $(STAMP)
	$(PY) -m pytest -q -m soak tests

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

bench-isolation: $(STAMP)
	$(PY) benchmarks/isolation.py

bench-residuals: $(STAMP)
	$(PY) benchmarks/residuals.py

bench-fork: $(STAMP)
	$(PY) benchmarks/fork_cost.py

bench-composed: $(STAMP)
	$(PY) benchmarks/composed.py

# Two dist_sync workers + one server on 127.0.0.1, a decorated loss, Gluon's Trainer.
dist-demo: $(STAMP)
	$(PY) -m customop.distributed.launch -n 2 -s 1 --launcher local --timeout 300 \
		$(PY) examples/dist_train.py --api gluon --kvstore dist_sync --center-loss 0.1

clean:
	rm -rf $(VENV) build *.egg-info
