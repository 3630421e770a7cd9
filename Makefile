# The two commands a newcomer needs: `make demo` and `make test`. Both set everything up.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test install system-deps clean

demo: $(STAMP)
	$(BIN)/llm-sidecar demo $(if $(DURATION),--duration $(DURATION))

test: $(STAMP) system-deps
	$(BIN)/pytest -q $(PYTEST_ARGS)

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

# Debian packages the tests use (promtool from prometheus, nginx for the benchmark).
system-deps:
	@bash scripts/system-deps.sh

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis *.egg-info
