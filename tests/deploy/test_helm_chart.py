"""The Helm chart: `helm lint --strict` passes, `helm template` with every feature on validates
(kubernetes-validate, strict; the ServiceMonitor CRD is checked field by field, its schema is
not in kubernetes-validate), every control-plane pod meets the restricted Pod Security profile
with its own ServiceAccount, migrations are a pre-install/pre-upgrade hook, the NetworkPolicy
keeps the internal port (/metrics, /admin/) to monitoring and the release's pods, and the
values (image, replicas per role, existing Secret, HPA) land where they should."""

from __future__ import annotations

import kubernetes_validate
import pytest

from tests.deploy.test_manifests import (
    CHART,
    K8S_VERSION,
    PUBLIC_URL,
    QUEUES,
    containers,
    helm,
    render,
)

EVERYTHING = (
    "ingress.enabled=true",
    "ingress.className=nginx",
    "ingress.tlsSecretName=nvke-tls",
    "serviceMonitor.enabled=true",
    "autoscaling.web.enabled=true",
    "agent.enabled=true",
)


@pytest.fixture(scope="module")
def everything() -> list[dict]:
    return render(*EVERYTHING)


def by(objects, kind, name):
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)


def test_helm_lint_is_clean_with_defaults_and_with_everything_on():
    kube = ["--kube-version", f"{K8S_VERSION}.0", "--set", PUBLIC_URL]
    assert "0 chart(s) failed" in helm("lint", "--strict", str(CHART), *kube).stdout
    sets = [arg for item in EVERYTHING for arg in ("--set", item)]
    assert "0 chart(s) failed" in helm("lint", "--strict", str(CHART), *kube, *sets).stdout


def test_every_rendered_object_validates(everything):
    kinds = sorted({o["kind"] for o in everything})
    assert kinds == [
        "ConfigMap",
        "DaemonSet",
        "Deployment",
        "HorizontalPodAutoscaler",
        "Ingress",
        "Job",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
    ]
    for obj in everything:
        if obj["kind"] != "ServiceMonitor":
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    monitor = by(everything, "ServiceMonitor", "nvke")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["endpoints"] == [
        {"port": "internal", "path": "/metrics", "interval": "30s"}
    ]
    service = by(everything, "Service", "nvke-web")
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {
        "http": 80,
        "internal": 9000,
    }


def test_control_plane_pods_are_restricted_with_their_own_service_account(everything):
    pods = [o for o in everything if o["kind"] in ("Deployment", "Job")]
    assert len(pods) == 1 + len(QUEUES) + 1 + 1  # web, workers, beat, migrate
    accounts = {o["metadata"]["name"] for o in everything if o["kind"] == "ServiceAccount"}
    assert accounts == {"nvke", "nvke-migrate"}
    for obj in pods:
        pod = obj["spec"]["template"]["spec"]
        name = obj["metadata"]["name"]
        assert pod["serviceAccountName"] in accounts, name
        assert pod["automountServiceAccountToken"] is False, name
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["tmp"] == {"name": "tmp", "emptyDir": {}}, name
        for c in containers(obj):
            sc = c["securityContext"]
            assert sc == {
                "allowPrivilegeEscalation": False,
                "readOnlyRootFilesystem": True,
                "capabilities": {"drop": ["ALL"]},
            }, name
            assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"], name
            assert "requests" in c["resources"], name


def test_migrations_are_a_pre_install_and_pre_upgrade_hook(everything):
    job = by(everything, "Job", "nvke-migrate")
    notes = job["metadata"]["annotations"]
    assert notes["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert "before-hook-creation" in notes["helm.sh/hook-delete-policy"]
    account = by(everything, "ServiceAccount", "nvke-migrate")
    assert account["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert int(account["metadata"]["annotations"]["helm.sh/hook-weight"]) < int(
        notes["helm.sh/hook-weight"]
    )
    (c,) = containers(job)
    assert c["command"][-1].startswith("python manage.py migrate --noinput")
    # a hook runs before the release's ConfigMap exists: the configuration is inline
    assert "configMapRef" not in str(c["envFrom"])
    assert {e["name"] for e in c["env"]} >= {"NVKE_DEFAULT_PROVIDER", "LOG_LEVEL"}


def test_the_network_policy_keeps_metrics_and_admin_internal(everything):
    policy = by(everything, "NetworkPolicy", "nvke-web")
    public, internal = policy["spec"]["ingress"]
    assert public["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert internal["ports"] == [{"port": "internal", "protocol": "TCP"}]
    monitoring = {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
    assert internal["from"][0] == {"namespaceSelector": monitoring}
    controller = {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}
    assert public["from"][0] == {"namespaceSelector": controller}
    (web,) = containers(by(everything, "Deployment", "nvke-web"))
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in web["env"]}
    assert env["GUNICORN_BIND"] == "0.0.0.0:8000 0.0.0.0:9000"
    # kubelet probes and Prometheus name the pod's IP as Host: allowed (issue 26)
    assert env["NVKE_POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert by(everything, "ConfigMap", "nvke-config")["data"]["NVKE_INTERNAL_PORT"] == "9000"
    ingress = by(everything, "Ingress", "nvke")
    (path,) = ingress["spec"]["rules"][0]["http"]["paths"]
    assert path["backend"]["service"] == {"name": "nvke-web", "port": {"name": "http"}}
    assert ingress["spec"]["tls"] == [{"hosts": ["nvke.example.com"], "secretName": "nvke-tls"}]


def test_values_set_image_replicas_secret_and_autoscaling():
    objects = render(
        "image.repository=registry.example.com/nvke",
        "image.tag=1.2.3",
        "workers.reconcile.replicas=5",
        "beat.replicas=1",
        "existingSecret=prod-db",
    )
    images = {c["image"] for o in objects for c in containers(o)}
    assert images == {"registry.example.com/nvke:1.2.3"}
    assert by(objects, "Deployment", "nvke-worker-reconcile")["spec"]["replicas"] == 5
    assert by(objects, "Deployment", "nvke-beat")["spec"]["replicas"] == 1
    assert by(objects, "Deployment", "nvke-web")["spec"]["replicas"] == 2
    (web,) = containers(by(objects, "Deployment", "nvke-web"))
    assert {"secretRef": {"name": "prod-db"}} in web["envFrom"]
    scaled = render("autoscaling.web.enabled=true")
    assert "replicas" not in by(scaled, "Deployment", "nvke-web")["spec"]
    hpa = by(scaled, "HorizontalPodAutoscaler", "nvke-web")
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 10)


def test_without_a_secret_the_chart_refuses_to_render():
    done = helm(
        "template",
        "nvke",
        str(CHART),
        "--kube-version",
        f"{K8S_VERSION}.0",
        "--set",
        "existingSecret=",
        "--set",
        PUBLIC_URL,
        check=False,
    )
    assert done.returncode != 0
    assert "existingSecret" in done.stderr


def test_the_agent_daemonset_has_probes_on_its_health_endpoint(everything):
    agent = by(everything, "DaemonSet", "nvke-agent")
    (c,) = containers(agent)
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["ports"] == [{"name": "metrics", "containerPort": 9401}]
    config = by(everything, "ConfigMap", "nvke-agent-config")["data"]["agent.toml"]
    assert 'server = "http://nvke-web.nvke-system.svc"' in config
    assert 'metrics_address = "0.0.0.0:9401"' in config
    assert agent["spec"]["template"]["spec"]["nodeSelector"] == {"nvidia.com/gpu.present": "true"}


def test_the_chart_requires_the_public_url_and_refuses_a_wildcard_host():
    """Issue 26: password-reset links come from NVKE_PUBLIC_URL, never a request's Host, and
    ALLOWED_HOSTS lists names (the chart's default was "*")."""
    missing = render("publicUrl=", check=False)
    assert missing.returncode != 0 and "publicUrl: the portal's public origin" in missing.stderr
    for item in ("allowedHosts={*}", "config.ALLOWED_HOSTS=*"):
        wildcard = render(item, check=False)
        assert wildcard.returncode != 0, item
        assert "ALLOWED_HOSTS may not contain '*'" in wildcard.stderr, item
    config = by(render(*EVERYTHING, "allowedHosts={nvke.internal}"), "ConfigMap", "nvke-config")
    assert config["data"]["NVKE_PUBLIC_URL"] == "https://nvke.example.com"
    assert config["data"]["ALLOWED_HOSTS"].split(",") == [
        "nvke-web",
        "nvke-web.nvke-system.svc",
        "nvke-web.nvke-system.svc.cluster.local",
        "nvke.internal",
        "nvke.example.com",
    ]
    # a plain string (--set allowedHosts=a,b, the first thing people type) is a list of names,
    # and anything else is refused naming the value and the forms it takes
    config = by(render("allowedHosts=a.example\\,b.example"), "ConfigMap", "nvke-config")
    assert config["data"]["ALLOWED_HOSTS"].split(",")[3:] == ["a.example", "b.example"]
    number = render("allowedHosts=5", check=False)
    assert number.returncode != 0
    assert "allowedHosts: a list of host names" in number.stderr, number.stderr


def test_mail_is_never_console_mail_and_can_be_explicitly_off():
    """Issue 26 leftover: EMAIL_URL left unset used to print reset links to the pod log. The
    chart names EMAIL_URL as a key of the Secret (pods refuse to start without it, nvke.E005),
    refuses console mail, and ``mailDisabled`` sets an explicit backend that sends nothing."""
    default = by(render(), "ConfigMap", "nvke-config")["data"]
    assert "EMAIL_URL" not in default  # from existingSecret
    off = by(render("mailDisabled=true"), "ConfigMap", "nvke-config")["data"]
    assert off["EMAIL_URL"] == "dummymail://"
    console = render("config.EMAIL_URL=consolemail://", check=False)
    assert console.returncode != 0 and "consolemail" in console.stderr
