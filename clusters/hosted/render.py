"""Production rendering: one hosted control plane as objects of the management cluster.

Under ``make run`` the control-plane manager runs the processes; on Kubernetes (the Helm chart)
NVKE renders, per control plane, what Kamaji renders for a TenantControlPlane:

- ``Secret <name>-pki``: the cluster's certificates, keys, kubeconfigs and encryption config
  (the same files :class:`clusters.hosted.processes.ControlPlaneFiles` writes), and the
  cluster's etcd client certificate;
- ``Deployment <name>``: kube-apiserver, kube-controller-manager and kube-scheduler as three
  containers of one pod (the official images at the cluster's version), with the command lines
  of :func:`clusters.hosted.processes.argv`, the Secret mounted read-only, a ``/readyz``
  readiness probe and ``/livez`` liveness probe, the environment of
  :func:`clusters.hosted.processes.environment` (kube-apiserver's GOGC);
- ``Service <name>``: ``LoadBalancer`` on 6443 (one address per cluster; with an SNI proxy in
  front, ``ClusterIP`` and a host name per cluster instead).

Applied with the ``kubernetes`` client (server-side apply, field manager ``nvke``).
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from .pki import ControlPlanePki
from .processes import COMPONENTS, ControlPlaneFiles, EtcdEndpoint, argv, environment

MOUNT = Path("/etc/nvke/control-plane")
PORT = 6443
IMAGE = "registry.k8s.io/{component}:v{version}"
FIELD_MANAGER = "nvke"


def object_name(cluster_id: str) -> str:
    """``cp-<cluster id>``: a DNS-1123 name per control plane (42 characters)."""
    return f"cp-{cluster_id}"


def render(
    *,
    cluster_id: str,
    cluster_name: str,
    version: str,
    pki: ControlPlanePki,
    etcd_url: str,
    etcd_ca: str,
    etcd_client: tuple[str, str],
    namespace: str,
) -> list[dict[str, Any]]:
    """The Secret, Deployment and Service of one control plane (plain dicts, apply-ready).
    ``version`` is a full patch version (``"1.36.3"``); ``etcd_client`` is (cert, key) PEM."""
    name = object_name(cluster_id)
    labels = {"app.kubernetes.io/name": "nvke-control-plane", "nvke.dev/cluster": cluster_id}
    files = ControlPlaneFiles(MOUNT)
    etcd = EtcdEndpoint(
        etcd_url, MOUNT / "etcd-ca.crt", MOUNT / "etcd-client.crt", MOUNT / "etcd-client.key"
    )
    data = _secret_files(name=cluster_name, pki=pki)
    data.update(
        {
            "etcd-ca.crt": etcd_ca,
            "etcd-client.crt": etcd_client[0],
            "etcd-client.key": etcd_client[1],
        }
    )
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": f"{name}-pki", "namespace": namespace, "labels": labels},
        "type": "Opaque",
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in sorted(data.items())},
    }
    containers = []
    for component in COMPONENTS:
        command = argv(
            component,
            binary=Path(component),
            cluster_id=cluster_id,
            cluster_name=cluster_name,
            port=PORT,
            files=files,
            etcd=etcd,
        )
        # in a pod the apiserver listens on the pod's address; the Service fronts it
        command = [a for a in command if not a.startswith(("--bind-address", "--advertise"))]
        container: dict[str, Any] = {
            "name": component,
            "image": IMAGE.format(component=component, version=version),
            "command": command,
            "volumeMounts": [{"name": "pki", "mountPath": str(MOUNT), "readOnly": True}],
            "resources": {"requests": _REQUESTS[component]},
        }
        if env := environment(component):
            container["env"] = [{"name": k, "value": v} for k, v in env.items()]
        if component == "kube-apiserver":
            container["ports"] = [{"name": "https", "containerPort": PORT}]
            container["readinessProbe"] = _probe("/readyz")
            container["livenessProbe"] = {**_probe("/livez"), "failureThreshold": 8}
        containers.append(container)
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "automountServiceAccountToken": False,
                    "containers": containers,
                    "volumes": [
                        {
                            "name": "pki",
                            "secret": {"secretName": f"{name}-pki", "defaultMode": 0o400},
                        }
                    ],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "type": "LoadBalancer",
            "selector": labels,
            "ports": [{"name": "https", "port": PORT, "targetPort": "https"}],
        },
    }
    return [secret, deployment, service]


_REQUESTS = {
    "kube-apiserver": {"cpu": "250m", "memory": "320Mi"},
    "kube-controller-manager": {"cpu": "100m", "memory": "128Mi"},
    "kube-scheduler": {"cpu": "50m", "memory": "64Mi"},
}


def _probe(path: str) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": PORT, "scheme": "HTTPS"},
        "periodSeconds": 5,
        "timeoutSeconds": 3,
    }


def _secret_files(*, name: str, pki: ControlPlanePki) -> dict[str, str]:
    """The files of :class:`ControlPlaneFiles` for a pod (kubeconfigs pointing at the pod's
    own apiserver on localhost)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        files = ControlPlaneFiles(Path(tmp))
        files.write(name=name, port=PORT, pki=pki)
        return {p.name: p.read_text() for p in Path(tmp).iterdir()}


def apply(api_client, objects: list[dict[str, Any]]) -> None:
    """Server-side apply ``objects`` with the ``kubernetes`` client (field manager ``nvke``)."""
    from kubernetes import dynamic

    client = dynamic.DynamicClient(api_client)
    for obj in objects:
        resource = client.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        resource.server_side_apply(
            body=obj,
            name=obj["metadata"]["name"],
            namespace=obj["metadata"]["namespace"],
            field_manager=FIELD_MANAGER,
            force_conflicts=True,
        )
