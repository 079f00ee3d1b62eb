# harness — two commands on a fresh machine: `make sweep` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
CLUSTER ?= local
SCENARIO ?= scenarios/smoke.yaml
RESULTS ?= results
REPORTS ?= reports
# PACK=1: on a SLURM profile, cells of one job shape share one job (harness sweep --pack; docs/slurm.md)
PACK ?=
# CPU build for tests and CI; GPU users install the torch build for their CUDA into the venv first.
TORCH_SPEC ?= torch==2.13.0
DEEPSPEED_SPEC ?= deepspeed==0.19.8
PYTEST_ARGS ?=

.PHONY: setup sweep test test-fast lint report plan nightly baseline bench-report benchmarks docs clean help

help:
	@echo "make sweep  [CLUSTER=local SCENARIO=scenarios/smoke.yaml RESULTS=results]  run a scenario"
	@echo "            [PACK=1]   SLURM: one job per job shape, cells back to back (--pack)"
	@echo "make test   [SERIAL=1]                                                run every test (two pytest runs side by side)"
	@echo "make test-fast                                                        the unit tier (edit loop)"
	@echo "make lint                                                             ruff check + format check + mypy"
	@echo "make report [RESULTS=results]                                         HTML/Markdown report"
	@echo "make plan   [SCENARIO=... CLUSTER=...]                                predicted memory/FLOPs per cell"
	@echo "make nightly CLUSTER=a100 BASELINE=dir HISTORY=db [LABEL=...]       sweep, judge (baseline: exact; history: timing), add"
	@echo "make docs                                                             the documentation site, built strictly into build/site"
	@echo "make benchmarks [BENCH=bench_plan.py ...]                             run the benches small, write docs/benchmarks.md"

# `make setup` is idempotent: the stamp depends on pyproject.toml and this Makefile.
# Each long step says what it installs and how long it took on a 2-core machine with the wheels in pip's cache or a
# local index (measured from a fresh venv: torch 21 s, the package 33 s, DeepSpeed from its sdist 26 s); downloading
# them (torch's CPU wheel is about 190 MB) comes on top.
setup: $(VENV)/.stamp

$(VENV)/.stamp: pyproject.toml Makefile
	@test -x $(PY) || { echo "==> creating the virtualenv $(VENV) (a few seconds)"; $(PYTHON) -m venv $(VENV); }
	@# an already-installed torch (e.g. a CUDA build a GPU user put there) is kept
	@$(PY) -c "import torch" 2>/dev/null && echo "==> torch is in $(VENV) already: kept" || { \
		echo "==> installing $(TORCH_SPEC) (about 20 s with the wheel at hand; its download, about 190 MB for the CPU build, comes first)"; \
		$(PY) -m pip install -q "$(TORCH_SPEC)"; }
	@echo "==> installing harness and its test and lint tools into $(VENV) (about 30 s)"
	@$(PY) -m pip install -q -e ".[test,lint]"
	@# DeepSpeed builds against the installed torch (no build isolation, or pip pulls a CUDA torch)
	@$(PY) -c "import deepspeed" 2>/dev/null && echo "==> deepspeed is in $(VENV) already: kept" || { \
		echo "==> installing $(DEEPSPEED_SPEC), built against that torch (about 30 s)"; \
		$(PY) -m pip install -q --no-build-isolation "$(DEEPSPEED_SPEC)" hjson ninja py-cpuinfo psutil msgpack; }
	@touch $@
	@echo "==> $(VENV) is ready (make setup does nothing more until pyproject.toml or this Makefile changes)"

sweep: setup
	$(VENV)/bin/harness sweep $(SCENARIO) --cluster $(CLUSTER) --results $(RESULTS)$(if $(filter 1,$(PACK)), --pack)

plan: setup
	$(VENV)/bin/harness plan $(SCENARIO) --cluster $(CLUSTER)

report: setup
	$(VENV)/bin/harness report $(RESULTS) -o $(REPORTS)/$$(basename $(SCENARIO) .yaml)

# `make test` runs every test as three pytest runs side by side: tests/slurm (the SLURM cluster's tests, which mostly
# wait on it: one-minute time limits, queued jobs) with the gloo modules of issue 53 (the model knobs', the
# transformers classes' and the factory modules' sweeps); tests/unit and tests/faults with two gloo modules of issue
# 49 (the layout property draws, fp16's agreed overflow); and the rest (dist, history, integration). Each keeps about a third of the 2 cores busy, so side by side they take little longer than the
# longest (docs/slurm.md, "tests/slurm in `make test`"). Each prints its 20 slowest tests; the runs beside come after
# the first in the log. With PYTEST_ARGS (a selection, -x, ...) or SERIAL=1: one pytest run, one test at a time.
SERIAL ?=
BESIDE := tests/slurm tests/dist/test_model_knobs.py tests/dist/test_transformers_impl.py tests/dist/test_factory_model.py
BESIDE2 := tests/unit tests/faults tests/dist/test_layout_property.py tests/dist/test_layout_fp16.py

# the docs extra too: tests/unit/test_docs_site.py builds the site (without it those tests would only skip)
test: setup $(VENV)/.docs-stamp
ifneq ($(SERIAL)$(PYTEST_ARGS),)
	$(PY) -m pytest $(PYTEST_ARGS)
else
	@# NOTE: no cache in the runs beside: runs writing .pytest_cache/ at their ends would lose each other's
	@# lastfailed; bash gives the background runs the default SIGINT, so Ctrl-C ends all (fixtures torn down)
	@log=$$(mktemp); log2=$$(mktemp); \
	$(PY) -m pytest -p no:cacheprovider $(BESIDE) >"$$log" 2>&1 & beside=$$!; \
	$(PY) -m pytest -p no:cacheprovider $(BESIDE2) >"$$log2" 2>&1 & beside2=$$!; \
	$(PY) -m pytest $(addprefix --ignore=,$(BESIDE) $(BESIDE2)); main=$$?; \
	wait $$beside; beside_rc=$$?; wait $$beside2; beside2_rc=$$?; \
	printf '\n==== %s, run beside the tests above:\n' "$(BESIDE)"; cat "$$log"; \
	printf '\n==== %s, run beside the tests above:\n' "$(BESIDE2)"; cat "$$log2"; rm -f "$$log" "$$log2"; \
	echo "make test: pytest exit $$main (the others), $$beside_rc ($(BESIDE)), $$beside2_rc ($(BESIDE2))"; \
	[ $$main -eq 0 ] && [ $$beside_rc -eq 0 ] && [ $$beside2_rc -eq 0 ]
endif

# the unit tier: pure tests, no process groups, SLURM or browser; the slow ones (report builds, subprocesses) left out
test-fast: setup
	$(PY) -m pytest tests/unit -m "not slow and not chromium" $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check harness tests bench docs/hooks docs/scripts
	$(VENV)/bin/ruff format --check harness tests bench docs/hooks docs/scripts
	$(VENV)/bin/mypy

# nightly: fresh sweep of scenarios/nightly.yaml; exact metrics (collective bytes, predicted memory) compared with
# BASELINE; timing judged against the cell's own history in HISTORY (between-run noise, change points), a flagged
# cell re-run CONFIRM times and judged again on those runs (only a regression that persists fails); then the
# night (re-runs included) is added to the history and reported. Exit 1 when either judge finds a regression, 2 on
# bad input.
NIGHTLY_SCENARIO ?= scenarios/nightly.yaml
BASELINE ?= baselines/$(CLUSTER)
HISTORY ?= history/$(CLUSTER).sqlite
LABEL ?= $(shell git rev-parse --short HEAD 2>/dev/null)
NIGHTLY_RESULTS ?= $(RESULTS)/nightly-$(CLUSTER)
NIGHTLY_REPORT ?= $(REPORTS)/nightly-$(CLUSTER)
COMPARE_ARGS ?=
# flagged cells are re-run this many times and judged again before the night fails (0: judge the first run alone)
CONFIRM ?= 3

nightly: setup
	rm -rf $(NIGHTLY_RESULTS) $(NIGHTLY_REPORT)
	mkdir -p $(NIGHTLY_REPORT) $(if $(filter postgresql://% postgres://%,$(HISTORY)),,$(dir $(HISTORY)))
	@# sweep exit 1 = some cells failed: still judge (newly failing cells are regressions there); 2 = bad input
	$(VENV)/bin/harness sweep $(NIGHTLY_SCENARIO) --cluster $(CLUSTER) --results $(NIGHTLY_RESULTS) || test $$? -eq 1
	@set +e; \
	$(VENV)/bin/harness compare $(BASELINE) $(NIGHTLY_RESULTS) --metric exact --output-dir $(NIGHTLY_REPORT) $(COMPARE_ARGS); \
	exact=$$?; \
	if [ -n "$(filter postgresql://% postgres://%,$(HISTORY))" ] || [ -e "$(HISTORY)" ]; then \
	  $(VENV)/bin/harness history check --db $(HISTORY) $(NIGHTLY_RESULTS) -o $(NIGHTLY_REPORT)/history.md --format md \
	    --confirm $(CONFIRM); \
	  timing=$$?; \
	else \
	  echo "history $(HISTORY): first night, nothing to judge timing against yet"; timing=0; \
	fi; \
	if [ $$exact -eq 2 ] || [ $$timing -eq 2 ]; then exit 2; fi; \
	$(VENV)/bin/harness history add --db $(HISTORY) $(NIGHTLY_RESULTS) --label "$(LABEL)" || exit 2; \
	$(VENV)/bin/harness report $(NIGHTLY_RESULTS) -o $(NIGHTLY_REPORT)/report --history $(HISTORY) || exit 2; \
	if [ $$exact -ne 0 ] || [ $$timing -ne 0 ]; then exit 1; fi

# baseline: re-sweep the smoke scenario and make it the committed baseline that CI compares exactly against
# (collective bytes, predicted memory and bytes). Run it, on a quiet machine, when a change alters those or the
# record's fields on purpose, or changes how a local cell runs (launcher, warm fork, allocator, threads: a plain
# `harness compare` judges timings and RSS against it too); commit it.
baseline: setup
	rm -rf .baseline-sweep
	$(VENV)/bin/harness sweep scenarios/smoke.yaml --results .baseline-sweep
	$(VENV)/bin/harness compare baselines/smoke-local .baseline-sweep/smoke --metric exact --promote --force
	rm -rf .baseline-sweep

bench-report: setup
	$(PY) bench/bench_report.py

# benchmarks: the bench scripts at small sizes (minutes, not hours), their printed figures written into
# docs/benchmarks.md with the date, the machine and its load (docs/scripts/benchmarks.py; the page's hand-written
# measurements on record are kept). BENCH=bench_plan.py runs only the benches named. Exit 1 when a bench failed.
BENCH ?=
benchmarks: setup
	$(PY) docs/scripts/benchmarks.py $(if $(BENCH),--only $(BENCH))

# docs: the documentation site (mkdocs.yml) built with --strict (a broken link, anchor or nav entry fails it) into
# DOCS_SITE; its reference pages (every command, the settings, the record) are generated from the code by
# docs/hooks/reference.py. The docs extra (MkDocs, Material, mkdocs-click) goes into the venv once, like setup's.
DOCS_SITE ?= build/site
docs: $(VENV)/.docs-stamp
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir $(DOCS_SITE)
	@echo "site: $(DOCS_SITE)/index.html"

$(VENV)/.docs-stamp: $(VENV)/.stamp pyproject.toml
	$(PY) -m pip install -q -e ".[docs]"
	@touch $@

clean:
	rm -rf $(RESULTS) $(REPORTS) .submitit

# The SLURM cluster on localhost that tests/slurm and `--cluster local-slurm` use (docs/slurm.md); needs root.
.PHONY: slurm-up slurm-down slurm-status
slurm-up:
	scripts/slurm-local.sh up

slurm-down:
	scripts/slurm-local.sh down

slurm-status:
	scripts/slurm-local.sh status
