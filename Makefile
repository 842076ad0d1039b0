# NVKE developer entry points. `make run` (embedded PostgreSQL + Redis, demo data) and
# `make test` (the whole suite on the machine's PostgreSQL 127.0.0.1:5432 and Redis :6379).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Tests use their own Redis database number so they never touch a developer's data.
TEST_REDIS_URL ?= redis://127.0.0.1:6379/15

.PHONY: install run test lint bench

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml agent/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]" -e ./agent
	touch $@

run: install
	$(PY) -m nvke.embedded run

test: install
	REDIS_URL=$${REDIS_URL:-$(TEST_REDIS_URL)} LOG_LEVEL=$${LOG_LEVEL:-WARNING} $(PY) -m pytest $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) manage.py makemigrations --check --dry-run

bench: install
	$(PY) -m pytest tests/bench -q -s -p no:cacheprovider --override-ini addopts=
