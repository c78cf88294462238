# The two set-up commands: `make demo` and `make test`. Both create .venv on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv test lint demo bench docs clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench examples
	$(VENV)/bin/ruff format --check src tests bench examples
	$(VENV)/bin/mypy src

test: lint
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
