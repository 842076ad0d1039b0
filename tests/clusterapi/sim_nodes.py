"""SIMULATED kubelets and GPU Operator for the Cluster API testbed (see testbed.py).

CAPD's in-memory backend simulates the machines and gives each workload cluster an in-memory
API server that Cluster API's controllers use (Nodes, etcd members, control-plane pods). That
server cannot hold what NVKE writes into a workload cluster (server-side apply, the GPU
Operator's CRDs, evictions, PodDisruptionBudgets), so a second, real kube-apiserver plays the
workload cluster for NVKE (``NVKE_CLUSTERAPI_WORKLOAD_KUBECONFIG``), and this thread keeps it
in step with what Cluster API created, as the machines' kubelets and the GPU Operator would:

* kubelet (and kube-controller-manager's node lifecycle, which clears ``not-ready``): for
  every Machine with a ``status.nodeRef``, a Node of that name registered with the
  ``node-labels`` and ``taints`` of the Machine's own ``KubeadmConfig`` (what Cluster API's
  kubeadm bootstrap provider rendered from NVKE's template), ``Ready``, ``nodeInfo.kubeletVersion``
  = the Machine's ``spec.version``; the Node goes when its Machine does; pods bound to a Node
  run (phase ``Running``);
* GPU Operator: MIG Manager sets ``nvidia.com/mig.config.state`` (``success`` for a config in
  ConfigMap ``gpu-operator/nvke-mig-parted-config`` or ``all-disabled``, else ``failed``); GPU
  Feature Discovery labels ``gpu.count`` / ``mig-<profile>.count`` / ``gpu.replicas`` /
  ``gpu.sharing-strategy`` / ``gfd.timestamp`` from that config and the device-plugin config,
  for :data:`GPUS_PER_NODE` GPUs.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)

GPUS_PER_NODE = 2
SIM_LABEL = "nvke-testbed/simulated-kubelet"
MERGE = "application/merge-patch+json"


def _kv(text: str) -> dict[str, str]:
    out = {}
    for part in (text or "").split(","):
        if "=" in part:
            key, value = part.split("=", 1)
            out[key] = value
    return out


def gpu_operator_labels(
    labels: dict[str, str], parted: dict[str, Any], plugin: dict[str, str], gpus: int
) -> dict[str, str]:
    """The labels MIG Manager and GFD would leave on a GPU node (``labels`` its current)."""
    labels = dict(labels)
    devices: dict[str, int] = {}
    config = labels.get("nvidia.com/mig.config")
    if config:
        entries = (parted.get("mig-configs") or {}).get(config)
        if entries is None and config != "all-disabled":
            labels["nvidia.com/mig.config.state"] = "failed"
            return labels
        labels["nvidia.com/mig.config.state"] = "success"
        for entry in entries or []:
            if entry.get("mig-enabled"):
                for profile, count in (entry.get("mig-devices") or {}).items():
                    devices[profile] = devices.get(profile, 0) + count
    doc = yaml.safe_load(plugin.get(labels.get("nvidia.com/device-plugin.config", ""), "") or "{}")
    doc = doc or {}
    strategy = (doc.get("flags") or {}).get("migStrategy", "none")
    for label in [k for k in labels if re.match(r"nvidia\.com/mig-.*\.count$", k)]:
        del labels[label]
    if strategy == "mixed":
        for profile, count in devices.items():
            labels[f"nvidia.com/mig-{profile.replace('+', '.')}.count"] = str(count * gpus)
        labels["nvidia.com/gpu.count"] = str(gpus)
    elif strategy == "single" and devices:
        labels["nvidia.com/gpu.count"] = str(sum(devices.values()) * gpus)
    else:
        labels["nvidia.com/gpu.count"] = str(gpus)
    sharing = doc.get("sharing") or {}
    kind = "time-slicing" if "timeSlicing" in sharing else "mps" if "mps" in sharing else ""
    if kind:
        block = sharing["timeSlicing" if kind == "time-slicing" else "mps"]
        labels["nvidia.com/gpu.sharing-strategy"] = kind
        labels["nvidia.com/gpu.replicas"] = str(block["resources"][0]["replicas"])
    else:
        labels["nvidia.com/gpu.sharing-strategy"] = "none"
        labels["nvidia.com/gpu.replicas"] = "1"
    return labels


class SimulatedNodes(threading.Thread):
    """The loop described in the module docstring, every ``interval`` seconds."""

    def __init__(
        self,
        management: k8s.ApiClient,
        workload: k8s.ApiClient,
        namespace: str,
        interval: float = 0.5,
    ) -> None:
        super().__init__(name="simulated-kubelets", daemon=True)
        self.custom = k8s.CustomObjectsApi(management)
        self.core = k8s.CoreV1Api(workload)
        self.namespace = namespace
        self.interval = interval
        self.stopping = threading.Event()
        self.errors: list[str] = []

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                self.sync()
            except Exception as exc:
                self.errors.append(repr(exc))
                log.warning("simulated kubelets: %r", exc)
            self.stopping.wait(self.interval)

    def stop(self) -> None:
        self.stopping.set()
        self.join(10)

    # -- one pass --------------------------------------------------------------------------------

    def _machines(self) -> list[dict[str, Any]]:
        return self.custom.list_namespaced_custom_object(
            "cluster.x-k8s.io", "v1beta2", self.namespace, "machines"
        )["items"]

    def _registration(self, machine: dict[str, Any]) -> tuple[dict[str, str], list[dict]]:
        ref = ((machine.get("spec") or {}).get("bootstrap") or {}).get("configRef") or {}
        if ref.get("kind") != "KubeadmConfig":
            return {}, []
        try:
            config = self.custom.get_namespaced_custom_object(
                "bootstrap.cluster.x-k8s.io",
                "v1beta2",
                self.namespace,
                "kubeadmconfigs",
                ref["name"],
            )
        except ApiException:
            return {}, []
        spec = config.get("spec") or {}
        registration = (spec.get("joinConfiguration") or {}).get("nodeRegistration") or (
            (spec.get("initConfiguration") or {}).get("nodeRegistration") or {}
        )
        args = {a["name"]: a.get("value", "") for a in registration.get("kubeletExtraArgs") or []}
        taints = [
            t
            for t in registration.get("taints") or []
            # Cluster API removes it from the Node once it synced the Machine's labels (it does
            # that on the in-memory workload cluster, not here)
            if t.get("key") != "node.cluster.x-k8s.io/uninitialized"
        ]
        return _kv(args.get("node-labels", "")), taints

    def sync(self) -> None:
        want = {
            m["status"]["nodeRef"]["name"]: m
            for m in self._machines()
            if ((m.get("status") or {}).get("nodeRef") or {}).get("name")
        }
        have = {n.metadata.name: n for n in self.core.list_node().items}
        for name, machine in want.items():
            if name not in have:
                self._register(name, machine)
        for name, node in have.items():
            if name not in want and (node.metadata.labels or {}).get(SIM_LABEL):
                with contextlib.suppress(ApiException):
                    self.core.delete_node(name)
        self._run_pods(set(want))
        self._gpu_operator()

    def _register(self, name: str, machine: dict[str, Any]) -> None:
        labels, taints = self._registration(machine)
        labels = {**labels, "kubernetes.io/hostname": name, SIM_LABEL: "true"}
        if "controlPlane" in str(machine["metadata"].get("labels") or {}):
            labels["node-role.kubernetes.io/control-plane"] = ""
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "providerID": (machine.get("spec") or {}).get("providerID", ""),
                "taints": [{k: t[k] for k in ("key", "value", "effect") if k in t} for t in taints],
            },
        }
        try:
            self.core.create_node(body)
        except ApiException as exc:
            if exc.status != 409:
                raise
        version = (machine.get("spec") or {}).get("version", "")
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.core.patch_node_status(
            name,
            {
                "status": {
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "True",
                            "reason": "KubeletReady",
                            "message": "kubelet is posting ready status (simulated)",
                            "lastHeartbeatTime": now,
                            "lastTransitionTime": now,
                        }
                    ],
                    "nodeInfo": {
                        "machineID": name,
                        "systemUUID": name,
                        "bootID": name,
                        "kernelVersion": "6.8.0-simulated",
                        "osImage": "Simulated Linux",
                        "containerRuntimeVersion": "containerd://2.0.0",
                        "kubeletVersion": version,
                        "kubeProxyVersion": version,
                        "operatingSystem": "linux",
                        "architecture": "amd64",
                    },
                    "addresses": [{"type": "Hostname", "address": name}],
                }
            },
            _content_type=MERGE,
        )
        # the API server's TaintNodesByCondition admission adds node.kubernetes.io/not-ready;
        # kube-controller-manager (not run here) removes it once the Node is Ready
        self.core.patch_node(
            name, {"spec": {"taints": body["spec"]["taints"]}}, _content_type=MERGE
        )

    def _run_pods(self, nodes: set[str]) -> None:
        for pod in self.core.list_pod_for_all_namespaces().items:
            if pod.spec.node_name in nodes and (pod.status.phase or "Pending") == "Pending":
                with contextlib.suppress(ApiException):
                    self.core.patch_namespaced_pod_status(
                        pod.metadata.name,
                        pod.metadata.namespace,
                        {"status": {"phase": "Running"}},
                        _content_type=MERGE,
                    )

    def _config(self, name: str) -> dict[str, str]:
        try:
            return self.core.read_namespaced_config_map(name, "gpu-operator").data or {}
        except ApiException:
            return {}

    def _gpu_operator(self) -> None:
        parted_text = self._config("nvke-mig-parted-config").get("config.yaml")
        parted = yaml.safe_load(parted_text) if parted_text else {}
        plugin = self._config("nvke-device-plugin-config")
        for node in self.core.list_node(label_selector="nvke.io/nodepool-id").items:
            before = dict(node.metadata.labels or {})
            after = gpu_operator_labels(before, parted or {}, plugin, GPUS_PER_NODE)
            if after != before:
                after["nvidia.com/gfd.timestamp"] = str(int(time.time()) + 1)
                patch = {k: v for k, v in after.items() if before.get(k) != v}
                patch.update({k: None for k in before if k not in after})
                self.core.patch_node(
                    node.metadata.name, {"metadata": {"labels": patch}}, _content_type=MERGE
                )
