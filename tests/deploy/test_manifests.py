"""Deployment manifests: the Helm chart (deploy/helm/nvke, the one documented way) renders
objects that validate (kubernetes-validate, strict, for a current Kubernetes version) and agree
with the settings; docker-compose.yml agrees too. The chart's own rules (restricted Pod
Security, hooks, NetworkPolicy, values) are in test_helm_chart.py.

``helm`` is built from its Go module (``make helm``: ``helm.sh/helm/v3/cmd/helm``) into a cache
folder outside the repository; without it the chart tests are skipped, saying so.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "nvke"
K8S_VERSION = "1.34"
QUEUES = {"reconcile", "telemetry", "billing", "default", "webhooks"}
CACHED_HELM = (
    Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "nvke" / "bin" / "helm"
)


def helm_binary() -> str | None:
    """``$NVKE_HELM``, else ``helm`` on PATH, else the one ``make helm`` builds."""
    for candidate in (os.environ.get("NVKE_HELM"), shutil.which("helm"), str(CACHED_HELM)):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    binary = helm_binary()
    if binary is None:
        reason = "no helm binary: `make helm` builds it from helm.sh/helm/v3/cmd/helm"
        if os.environ.get("CI"):  # .ci/run builds it: a missing helm there is a failure
            pytest.fail(reason)
        pytest.skip(reason)
    done = subprocess.run([binary, *args], capture_output=True, text=True, timeout=120)
    if check:
        assert done.returncode == 0, done.stderr
    return done


#: the one value the chart requires (it refuses to render without it)
PUBLIC_URL = "publicUrl=https://nvke.example.com"


def render(*sets: str, release: str = "nvke", check: bool = True):
    """``helm template`` of the chart in namespace nvke-system (``publicUrl`` set unless
    ``sets`` name it), as a list of objects; with ``check=False`` the finished process."""
    args = ["template", release, str(CHART), "--namespace", "nvke-system"]
    args += ["--kube-version", f"{K8S_VERSION}.0"]  # the version the objects validate against
    if not any(item.startswith("publicUrl=") for item in sets):
        sets = (PUBLIC_URL, *sets)
    for item in sets:
        args += ["--set", item]
    if not check:
        return helm(*args, check=False)
    return [d for d in yaml.safe_load_all(helm(*args).stdout) if d]


def containers(obj: dict) -> list[dict]:
    spec = obj.get("spec", {})
    pod = spec.get("template", {}).get("spec", {}) if "template" in spec else {}
    return pod.get("containers", []) + pod.get("initContainers", [])


def settings_env_names() -> set[str]:
    """Every environment variable the server reads: the names declared in the one settings
    registry (``nvke/settings_registry.py``; tests/test_settings_registry.py fails on any
    undeclared read at run time)."""
    from nvke.settings_registry import SETTINGS

    return {s.name for s in SETTINGS}


@pytest.fixture(scope="module")
def production() -> list[dict]:
    return render()


def test_every_object_validates_strictly(production):
    kinds = sorted({o["kind"] for o in production})
    assert kinds == [
        "ConfigMap",
        "Deployment",
        "Job",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "Service",
        "ServiceAccount",
    ]
    agent = [d for d in yaml.safe_load_all((ROOT / "deploy/agent/daemonset.yaml").read_text()) if d]
    for obj in production + agent:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_there_is_a_worker_per_queue_and_the_queues_match_the_routing(production):
    from django.conf import settings

    routed = {route["queue"] for route in settings.CELERY_TASK_ROUTES.values()}
    routed.add(settings.CELERY_TASK_DEFAULT_QUEUE)
    assert routed == QUEUES
    workers = {}
    for obj in production:
        for c in containers(obj):
            if c["command"][:4] == ["celery", "-A", "nvke", "worker"]:
                workers[obj["metadata"]["name"]] = c["command"][c["command"].index("-Q") + 1]
    assert sorted(workers.values()) == sorted(QUEUES)
    assert all(name == f"nvke-worker-{q}" for name, q in workers.items())


def test_one_image_probes_and_resources_everywhere(production):
    images = {c["image"] for o in production for c in containers(o)}
    assert images == {"ghcr.io/nvke/nvke:0.1.0"}
    web = next(
        o for o in production if o["metadata"]["name"] == "nvke-web" and o["kind"] == "Deployment"
    )
    (c,) = containers(web)
    assert c["command"] == ["gunicorn", "-c", "python:nvke.gunicorn_conf", "nvke.wsgi"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    for obj in production:
        for c in containers(obj):
            assert "requests" in c.get("resources", {}), obj["metadata"]["name"]
    for obj in production:
        assert obj["metadata"].get("namespace", "nvke-system") == "nvke-system"
    pdbs = {
        o["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"]
        for o in production
        if o["kind"] == "PodDisruptionBudget"
    }
    assert pdbs == {"nvke-web", "nvke-beat"} | {f"nvke-worker-{q}" for q in QUEUES}


def test_env_names_are_those_the_settings_read(production):
    known = settings_env_names()
    config = next(o for o in production if o["metadata"]["name"] == "nvke-config")
    assert set(config["data"]) <= known, set(config["data"]) - known
    for required in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "NVKE_SECRET_KEYS"):
        assert required in known
    agent_env = {"NVKE_SERVER", "NODE_NAME", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"}
    for obj in production:
        for c in containers(obj):
            names = {e["name"] for e in c.get("env", [])}
            assert names <= known | agent_env, names
            refs = {
                r.get("configMapRef", r.get("secretRef", {})).get("name")
                for r in c.get("envFrom", [])
            }
            assert refs <= {"nvke-config", "nvke-secrets"}, refs


def test_migrations_run_in_a_job_and_the_agent_only_on_gpu_nodes(production):
    job = next(o for o in production if o["kind"] == "Job")
    assert "manage.py migrate --noinput" in " ".join(containers(job)[0]["command"])
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy/agent/daemonset.yaml").read_text()) if d]
    agent = next(o for o in docs if o["kind"] == "DaemonSet")
    pod = agent["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["runtimeClassName"] == "nvidia"
    assert containers(agent)[0]["image"] == "ghcr.io/nvke/nvke:0.1.0"  # the chart's image
    assert containers(agent)[0]["securityContext"]["privileged"] is True  # scrubs reset GPUs
    config = next(o for o in docs if o["kind"] == "ConfigMap")["data"]["agent.toml"]
    assert 'source = "nvml"' in config and "nvke-web.nvke-system.svc" in config
    assert not any(o["kind"] == "DaemonSet" for o in production)  # agent.enabled=false


def test_docker_compose_agrees_with_the_settings():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert set(services) == {"postgres", "redis", "migrate", "web", "worker", "webhooks", "beat"}
    known = settings_env_names()
    for name in ("migrate", "web", "worker", "webhooks", "beat"):
        env = services[name]["environment"]
        assert set(env) <= known, set(env) - known
        assert env["DATABASE_URL"].startswith("postgres://")
        assert env["REDIS_URL"].startswith("redis://redis:6379")
        assert services[name]["build"] == "."
    queues = set()
    for name in ("worker", "webhooks"):  # deliveries have their own worker (issue 26)
        command = services[name]["command"]
        queues |= set(command[command.index("-Q") + 1].split(","))
    assert queues == QUEUES
    assert services["webhooks"]["command"][services["webhooks"]["command"].index("-Q") + 1] == (
        "webhooks"
    )
    assert services["web"]["command"] == [
        "gunicorn",
        "-c",
        "python:nvke.gunicorn_conf",
        "nvke.wsgi",
    ]
    assert "/healthz" in " ".join(services["web"]["healthcheck"]["test"])
    for svc in ("postgres", "redis"):
        assert services[svc]["healthcheck"]["test"]
    for svc in ("web", "worker", "webhooks", "beat"):
        assert (
            services[svc]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        )
    assert "manage.py migrate" in " ".join(services["migrate"]["command"])


def test_the_validator_catches_a_broken_manifest(production):
    web = copy.deepcopy(next(o for o in production if o["kind"] == "Deployment"))
    web["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(web, K8S_VERSION, strict=True)
