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
	deploy/capi-testbed/build.sh > /dev/null  # tests/clusterapi's binaries (once: see capi-bins)
	REDIS_URL=$${REDIS_URL:-$(TEST_REDIS_URL)} LOG_LEVEL=$${LOG_LEVEL:-WARNING} $(PY) -m pytest $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) manage.py makemigrations --check --dry-run

bench: install
	$(PY) -m pytest tests/bench -q -s -p no:cacheprovider --override-ini addopts=

# The soak test: the API is killed for 10 minutes while 5 agents report (and two of them are
# restarted); not one sample may be lost. `make test` runs the same test with a 30 s outage.
.PHONY: soak
soak: install
	NVKE_SOAK_OUTAGE_S=$${NVKE_SOAK_OUTAGE_S:-600} NVKE_SOAK_AGENTS=$${NVKE_SOAK_AGENTS:-5} \
	REDIS_URL=$${REDIS_URL:-$(TEST_REDIS_URL)} \
	$(PY) -m pytest tests/fleet/test_soak.py -q -s -p no:cacheprovider --timeout 1800

# Cluster API testbed binaries (kube-apiserver, etcd, Cluster API controllers, CAPD) built once
# from deploy/capi-testbed/go.mod into $NVKE_CAPI_BIN_DIR (default ~/.cache/nvke/capi-<hash>);
# tests/clusterapi builds them itself when missing. See README "Cluster API provider".
.PHONY: capi-bins
capi-bins:
	deploy/capi-testbed/build.sh
