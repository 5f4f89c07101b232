# Two commands: `make run` and `make test`. Each creates .venv when it is missing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DATA   ?= var
LISTEN ?= 127.0.0.1:8080

.PHONY: run test lint bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	@echo "better-compute control plane: http://$(LISTEN)  (root token: $(DATA)/root.token)"
	$(BIN)/better-compute-controlplane demo --data $(DATA) --listen $(LISTEN)

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python bench/api.py
	$(BIN)/python bench/reconciler.py
	$(BIN)/python bench/agent_footprint.py
	$(BIN)/python bench/reservations.py
	$(BIN)/python bench/durability.py
	$(BIN)/python bench/crash.py

clean:
	rm -rf $(VENV) $(DATA) .pytest_cache
