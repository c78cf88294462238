# The two set-up commands: `make demo` and `make test`. Both create .venv on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv test lint system demo bench docs clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench examples
	$(VENV)/bin/ruff format --check src tests bench examples
	$(VENV)/bin/mypy src

# System packages the tests drive for real: Slurm with munge (tests/test_slurm.py), nftables
# (packet loss between test hosts). Installed as root with apt-get; elsewhere those tests are
# skipped with the reason.
system:
	@if command -v slurmctld >/dev/null && command -v munged >/dev/null && command -v nft >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing slurm-wlm, munge and nftables (apt-get)"; \
	  { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge nftables >/dev/null; } \
	    || echo "apt-get failed: the tests that need Slurm or nftables will be skipped"; \
	else echo "not root with apt-get: the tests that need Slurm or nftables will be skipped"; fi

test: lint system
	$(VENV)/bin/pytest -q

# The demo's run writes docs/live-cluster.md's demo section and its figures (bench/demo_docs.py).
DEMO_RUN := .unicron/demo
demo: $(STAMP)
	rm -rf $(DEMO_RUN)
	$(VENV)/bin/unicron demo --root $(DEMO_RUN)
	$(PY) -m bench.demo_docs $(DEMO_RUN)

bench: $(STAMP)
	$(PY) -m bench.run

docs: $(STAMP)
	$(PY) -m bench.throughput_docs
	$(PY) -m bench.reference_docs

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
