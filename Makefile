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

demo: $(STAMP)
	$(VENV)/bin/unicron demo

bench: $(STAMP)
	$(PY) -m bench.run

docs: $(STAMP)
	$(PY) -m bench.throughput_docs

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
