# One command runs the main job (`make demo`), one passes the tests (`make test`).
# Each creates .venv when absent and installs what it needs: the CPU build of torch first
# (pinned, so pip does not fetch a multi-GB CUDA build), then the project with its extras.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.mgrpo-installed
TORCH_PIN ?= torch==2.13.0

.PHONY: install test test-all demo lint clean bench bench-quick

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check $(TORCH_PIN)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev,dist,lora]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

test-all: $(STAMP)
	$(PY) -m pytest -q -m "not gpu"

demo: $(STAMP)
	$(VENV)/bin/mgrpo eval --scenario wiki-hops --split stage2/test --agent oracle --out runs/demo
	$(VENV)/bin/mgrpo view runs/demo

bench: $(STAMP)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[bench]'
	$(PY) benchmarks/bench.py

bench-quick: $(STAMP)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[bench]'
	$(PY) benchmarks/bench.py --quick

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf runs .pytest_cache .ruff_cache
