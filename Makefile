# Two commands: `make demo` and `make test`. Each sets up .venv on first use.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export OMP_NUM_THREADS := 1

.PHONY: setup demo test bench mutation loss-curves clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned to the CPU wheel on this machine's disk
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: setup
	$(VENV)/bin/zerotrain demo

test: setup
	$(PY) -m pytest -q tests

bench: setup
	$(PY) benchmarks/stage0_vs_ddp.py

# The mutation score of the pure modules (tens of minutes; not part of test).
mutation: setup
	nice -n 10 $(PY) harness/mutation.py

# Rewrite tests/distributed/loss_curves/*.json after a deliberate change of the arithmetic.
loss-curves: setup
	ZEROTRAIN_WRITE_LOSS_CURVES=1 $(PY) -m pytest -q tests/distributed/test_loss_curves.py

clean:
	rm -rf $(VENV) build src/*.egg-info
