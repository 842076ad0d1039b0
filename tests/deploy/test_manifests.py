"""Deployment manifests: every Kubernetes object validates (kubernetes-validate, strict, for a
current Kubernetes version) and agrees with the settings; docker-compose.yml agrees too.

No kustomize binary is available here, so the overlay is rendered with the subset of kustomize
the manifests use (resources, namespace, images, replicas, labels); the test refuses any other
kustomization field, so the rendering stays faithful.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
K8S_VERSION = "1.34"
SUPPORTED_FIELDS = {"apiVersion", "kind", "resources", "namespace", "images", "replicas", "labels"}
QUEUES = {"reconcile", "telemetry", "billing", "default"}


def build(directory: Path) -> list[dict]:
    """Render a kustomization directory (the subset of kustomize described above)."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unsupported = set(kustomization) - SUPPORTED_FIELDS
    assert not unsupported, f"{directory}: extend the test's renderer for {unsupported}"
    objects: list[dict] = []
    for resource in kustomization.get("resources", []):
        path = (directory / resource).resolve()
        if path.is_dir():
            objects.extend(build(path))
        else:
            objects.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    objects = [copy.deepcopy(o) for o in objects]
    for label in kustomization.get("labels", []):
        for obj in objects:
            obj["metadata"].setdefault("labels", {}).update(label["pairs"])
    images = {i["name"]: i for i in kustomization.get("images", [])}
    replicas = {r["name"]: r["count"] for r in kustomization.get("replicas", [])}
    for obj in objects:
        if kustomization.get("namespace") and obj["kind"] != "Namespace":
            obj["metadata"]["namespace"] = kustomization["namespace"]
        if obj["metadata"]["name"] in replicas and "replicas" in obj.get("spec", {}):
            obj["spec"]["replicas"] = replicas[obj["metadata"]["name"]]
        for container in containers(obj):
            image = images.get(container["image"].split(":")[0])
            if image:
                container["image"] = f"{image['newName']}:{image['newTag']}"
    return objects


def containers(obj: dict) -> list[dict]:
    spec = obj.get("spec", {})
    pod = spec.get("template", {}).get("spec", {}) if "template" in spec else {}
    return pod.get("containers", []) + pod.get("initContainers", [])


def settings_env_names() -> set[str]:
    """Every environment variable the server reads: ``env("X")`` / ``env.int("X")`` in the
    settings and ``os.environ.get("X")`` / ``os.environ["X"]`` anywhere in its packages."""
    names: set[str] = set()
    for package in ("nvke", "tenants", "catalog", "fleet", "clusters", "nodepools", "billing"):
        for path in (ROOT / package).rglob("*.py"):
            text = path.read_text()
            names |= set(re.findall(r'env(?:\.\w+)?\(\s*"([A-Z][A-Z0-9_]+)"', text))
            names |= set(re.findall(r'os\.environ(?:\.get\(|\[)\s*"([A-Z][A-Z0-9_]+)"', text))
    return names


@pytest.fixture(scope="module")
def production() -> list[dict]:
    return build(KUBE / "overlays" / "production")


def test_every_object_validates_strictly(production):
    kinds = sorted({o["kind"] for o in production})
    assert kinds == [
        "ConfigMap",
        "Deployment",
        "Job",
        "Namespace",
        "PodDisruptionBudget",
        "Service",
    ]
    agent = [d for d in yaml.safe_load_all((ROOT / "deploy/agent/daemonset.yaml").read_text()) if d]
    for obj in production + build(KUBE / "base") + agent:
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
    config = next(o for o in production if o["kind"] == "ConfigMap")
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
            assert refs <= {"nvke-config", "nvke-secrets"}


def test_migrations_run_in_a_job_and_the_agent_only_on_gpu_nodes(production):
    job = next(o for o in production if o["kind"] == "Job")
    assert "manage.py migrate --noinput" in " ".join(containers(job)[0]["command"])
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy/agent/daemonset.yaml").read_text()) if d]
    agent = next(o for o in docs if o["kind"] == "DaemonSet")
    pod = agent["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["runtimeClassName"] == "nvidia"
    assert containers(agent)[0]["image"] == "ghcr.io/nvke/nvke:0.1.0"  # the overlay's image
    assert containers(agent)[0]["securityContext"]["privileged"] is True  # scrubs reset GPUs
    config = next(o for o in docs if o["kind"] == "ConfigMap")["data"]["agent.toml"]
    assert 'source = "nvml"' in config and "nvke-web.nvke-system.svc" in config
    assert not any(o["kind"] == "DaemonSet" for o in production)  # GPU hosts, not here


def test_docker_compose_agrees_with_the_settings():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert set(services) == {"postgres", "redis", "migrate", "web", "worker", "beat"}
    known = settings_env_names()
    for name in ("migrate", "web", "worker", "beat"):
        env = services[name]["environment"]
        assert set(env) <= known, set(env) - known
        assert env["DATABASE_URL"].startswith("postgres://")
        assert env["REDIS_URL"].startswith("redis://redis:6379")
        assert services[name]["build"] == "."
    worker_queues = services["worker"]["command"][services["worker"]["command"].index("-Q") + 1]
    assert set(worker_queues.split(",")) == QUEUES
    assert services["web"]["command"] == [
        "gunicorn",
        "-c",
        "python:nvke.gunicorn_conf",
        "nvke.wsgi",
    ]
    assert "/healthz" in " ".join(services["web"]["healthcheck"]["test"])
    for svc in ("postgres", "redis"):
        assert services[svc]["healthcheck"]["test"]
    for svc in ("web", "worker", "beat"):
        assert (
            services[svc]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        )
    assert "manage.py migrate" in " ".join(services["migrate"]["command"])


def test_the_validator_catches_a_broken_manifest(production):
    web = copy.deepcopy(next(o for o in production if o["kind"] == "Deployment"))
    web["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(web, K8S_VERSION, strict=True)
