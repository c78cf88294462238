# The two set-up commands: `make demo` and `make test`. Both create .venv on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv lock test lint system browser bytecode imports demo bench soak docs clean
, := ,

venv: $(STAMP)

# What is installed is exactly constraints.txt (pyproject.toml declares ranges; `make lock`
# resolves them into it): each package without its dependencies, since the file holds them all,
# in two pip processes at once (pip installs on one core: 18 s here instead of 38 s resolving
# '.[dev]' against the file; their output is shown where one fails: each warns of the other's
# packages half written as it scans what is installed), then Unicron itself (editable), then
# `pip check` that nothing it needs is missing. torchft, the peer the benchmarks measure
# (examples/torchft/), is in the file and must go in without its dependencies: its wheel names
# torch, which pip would fetch as a CUDA build (its OpenTelemetry packages are in the torchft
# extra). NetfilterQueue is built by `make system`, once apt-get has installed what it builds
# against. pip compiles nothing: what the tests and the demo import is compiled before they run
# (`bytecode`, `test`, `imports`).
PIP := -m pip install -q --disable-pip-version-check
TORCHFT := torchft-nightly==2026.10.26
LOCKED := $(VENV)/locked
$(STAMP): pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	grep -v -i -e '^#' -e '^netfilterqueue==' -e '^$$' constraints.txt > $(LOCKED).txt
	awk 'NR % 2' $(LOCKED).txt > $(LOCKED)-1.txt && awk '!(NR % 2)' $(LOCKED).txt > $(LOCKED)-2.txt
	@echo "installing constraints.txt's packages (two pip processes at once; each one's output in $(LOCKED)-N.log)"
	@$(PY) $(PIP) --no-compile --no-deps -r $(LOCKED)-1.txt > $(LOCKED)-1.log 2>&1 & \
	  $(PY) $(PIP) --no-compile --no-deps -r $(LOCKED)-2.txt > $(LOCKED)-2.log 2>&1; second=$$?; \
	  wait $$!; first=$$?; [ $$first -eq 0 ] || cat $(LOCKED)-1.log; [ $$second -eq 0 ] || cat $(LOCKED)-2.log; \
	  [ $$first -eq 0 ] && [ $$second -eq 0 ]
	$(PY) $(PIP) --no-compile --no-deps -e .
	$(PY) -m pip check --disable-pip-version-check \
	  || { echo "constraints.txt lacks what pyproject.toml asks for: run make lock"; exit 1; }
	touch $(STAMP)

# constraints.txt written again: pyproject.toml's ranges resolved afresh in a new virtual
# environment (the newest releases they allow), with what the tests use. Run after changing a
# range, then `make test`, and commit both.
LOCK_VENV := .venv-lock
lock:
	rm -rf $(LOCK_VENV) && python3 -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/python $(PIP) -e '.[dev]'
	$(LOCK_VENV)/bin/python $(PIP) --no-deps $(TORCHFT)
	$(LOCK_VENV)/bin/python $(PIP) -e '.[netfaults]' >/dev/null 2>&1 \
	  || echo "NetfilterQueue did not build here (make system installs what it needs): its pin is kept"
	$(LOCK_VENV)/bin/python -m pip freeze --all --exclude-editable | grep -v -e '^unicron' -e '^pip==' \
	  | sed 's/+cpu$$//' > $(LOCK_VENV)/freeze.txt
	@! grep ' @ ' $(LOCK_VENV)/freeze.txt || { echo "installed from a path or URL: cannot be pinned"; exit 1; }
	@grep -q '^torch==' $(LOCK_VENV)/freeze.txt || { echo "no torch in the freeze: nothing written"; exit 1; }
	grep -qi '^NetfilterQueue==' $(LOCK_VENV)/freeze.txt || grep -i '^NetfilterQueue==' constraints.txt \
	  >> $(LOCK_VENV)/freeze.txt
	{ sed -n '1,3p' constraints.txt; LC_ALL=C sort -f $(LOCK_VENV)/freeze.txt; } > constraints.txt.new
	mv constraints.txt.new constraints.txt && rm -rf $(LOCK_VENV)

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench examples harness
	$(VENV)/bin/ruff format --check src tests bench examples harness
	$(VENV)/bin/mypy src
	MYPYPATH=src $(VENV)/bin/mypy harness

# System packages driven for real, from Debian with apt-get as root (elsewhere what needs them
# is skipped with the reason): Slurm with munge (tests/test_slurm.py); nftables (packet loss
# between test hosts); iptables and libnetfilter-queue (delay between test hosts, with the
# NetfilterQueue package built against it: the `netfaults` extra); Chromium and its driver (the
# dashboard in a real browser: tests/test_live_dashboard.py, and the demo's screenshot); etcd
# (the store's etcd backend and the coordinators' leader election: tests/test_store.py,
# tests/test_live_failover.py).
# $(call apt,PACKAGES,COMMANDS THAT SHOW THEY ARE THERE,WHAT IS SKIPPED WITHOUT THEM)
apt = @if $(2); then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing $(1) (apt-get)"; \
	  { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(1) >/dev/null; } \
	    || echo "apt-get failed: $(3) will be skipped"; \
	else echo "not root with apt-get: $(3) will be skipped"; fi
SYSTEM_PACKAGES := slurm-wlm munge nftables iptables libnetfilter-queue-dev gcc etcd-server
SYSTEM_CHECK := command -v slurmctld >/dev/null && command -v munged >/dev/null && command -v nft >/dev/null \
	&& command -v iptables >/dev/null && [ -e /usr/include/libnetfilter_queue/libnetfilter_queue.h ] \
	&& command -v etcd >/dev/null
BROWSER_PACKAGES := chromium chromium-driver
BROWSER_CHECK := command -v chromium >/dev/null && command -v chromedriver >/dev/null

# One apt-get run for all of them (its index update takes seconds).
system: $(STAMP)
	$(call apt,$(SYSTEM_PACKAGES) $(BROWSER_PACKAGES),$(SYSTEM_CHECK) && $(BROWSER_CHECK),the tests that need Slurm$(,) nftables$(,) iptables$(,) etcd or a browser)
	@$(PY) -c "import netfilterqueue" 2>/dev/null \
	  || $(PY) $(PIP) -c constraints.txt -e '.[netfaults]' >/dev/null 2>&1 \
	  || echo "NetfilterQueue did not build: the tests that delay packets will be skipped"

browser:
	$(call apt,$(BROWSER_PACKAGES),$(BROWSER_CHECK),the browser test and the demo's screenshot)

# Bytecode for the project's own modules, as an install would write it: an editable install
# writes none, and where PYTHONDONTWRITEBYTECODE is set no process writes it either, so every
# worker, agent and coordinator a test starts compiled them again (a third of a second of CPU
# per worker start here; tests start hundreds). A stale file is recompiled in memory, unused.
bytecode: $(STAMP)
	@$(PY) -m compileall -q src examples bench tests harness >/dev/null

# The installed packages' bytecode is written by importing what a run will import, with
# PYTHONDONTWRITEBYTECODE lifted for that one process: a quarter of the 11,000 modules, where
# compiling them all took 29 s of both cores here. For the demo and the benchmarks, what a
# cluster's processes import: its coordinator and agents, and the library in its workers.
RUNTIME_MODULES := torch.distributed unicron.cli.main unicron.cli.live unicron.control.service.service \
	unicron.control.agent.agent unicron.train
imports: bytecode
	@PYTHONDONTWRITEBYTECODE= $(PY) -c 'import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]]' \
	  $(RUNTIME_MODULES)

# Three processes run the tests (pytest-xdist) on this project's two cores: the live tests wait
# on their workers' steps and deadlines as well as compute, and two at once left the cores idle a
# quarter of the run (1,125 s of CPU in 747 s; three: 10:30 against 12:27, the same commit,
# 2026-12-04). Each process is handed the next test as it takes one up (one queued behind the one
# it runs), in the order tests/conftest.py sets (the longest first).
# TEST_PROCESSES=1 runs them one after another.
# Before them, one process collects the tests with PYTHONDONTWRITEBYTECODE lifted: it writes the
# bytecode of every module the tests import, and pytest's of the tests and its plugins, whose
# asserts it rewrites (without it each test process compiled them again: 16 s to collect instead
# of 9 here). Where collecting fails, the run after it says why.
# The linters run beside that collection, on the other core: alone they keep one core busy for
# about 20 s (mypy). What they say is shown after the tests, and either failing fails `make test`;
# `make lint` runs them alone.
TEST_PROCESSES ?= 3
LINT_LOG := .unicron/lint.log
test: system bytecode
	@mkdir -p $(dir $(LINT_LOG))
	@$(MAKE) --no-print-directory lint > $(LINT_LOG) 2>&1 & linting=$$!; \
	PYTHONDONTWRITEBYTECODE= $(VENV)/bin/pytest -q --collect-only -p no:cacheprovider >/dev/null 2>&1; \
	$(VENV)/bin/pytest -q $(if $(filter 1,$(TEST_PROCESSES)),,-n $(TEST_PROCESSES) --dist load --maxschedchunk 1); \
	tested=$$?; wait $$linting; linted=$$?; cat $(LINT_LOG); \
	[ $$linted -eq 0 ] || echo "make test: the linters failed (above)"; \
	exit $$(( tested != 0 ? tested : linted ))

# The demo's run writes docs/live-cluster.md's demo section and its figures (bench/demo_docs.py).
DEMO_RUN := .unicron/demo
demo: $(STAMP) browser imports
	rm -rf $(DEMO_RUN)
	$(VENV)/bin/unicron demo --root $(DEMO_RUN)
	$(PY) -m bench.demo_docs $(DEMO_RUN)

bench: $(STAMP) imports
	$(PY) -m bench.run

# The 15-minute chaos soak alone (`make bench` runs it too; `make test` runs a short one):
# docs/bench/chaos.json and docs/reliability.md.
soak: $(STAMP) imports
	$(PY) -m bench.chaos

docs: $(STAMP)
	$(PY) -m bench.throughput_docs
	$(PY) -m bench.reference_docs

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
