"""The GPU add-ons of a hosted cluster's node pools, applied to its API by NVKE.

What is applied: the objects the ``clusterapi`` provider applies to a workload cluster, from the
same render (:func:`clusters.providers.clusterapi.render.render_gpu_operator`): each pool's
rendered GPU Operator inputs (``NodePoolSpec.gpu_config["manifests"]``: the mig-parted,
device-plugin and vGPU ConfigMaps in namespace ``gpu-operator``, merged across pools; a pinned
``NVIDIADriver``; the ``ComputeDomain`` of a pool kept in one NVLink domain), the fallback
``NVIDIADriver`` and the ``ClusterPolicy``; and the upstream CRDs they need
(``clusters/providers/crds/``, sources in its README).

:func:`sync` makes the API hold exactly the objects rendered for the given pools among NVKE's
(label ``app.kubernetes.io/managed-by: nvke``):

* the pools are rendered in name order, each one's ConfigMaps merged into those of the pools
  before it, so a removed pool's entries are simply not rendered;
* the digest of that rendering and of the CRDs is compared with the annotation
  ``nvke.io/addons-digest`` of the ClusterPolicy: equal, nothing else is done (one GET per
  step; the clusterapi provider keeps its digest on the MachineDeployment the same way);
* otherwise the CRDs are applied (server-side, as ``nvke``) and waited for until Established,
  then the namespaces, then each object, the ClusterPolicy last, carrying the new digest; then
  NVKE's objects of these kinds that were not rendered are deleted, the ClusterPolicy last (so
  no ClusterPolicy means nothing of NVKE's is left). CRDs stay when the last pool goes: the
  tenant's own objects may use them.

An object the API refuses (400, 403, 422: invalid against its CRD's schema …) does not stop the
others: its refusal is returned for every pool it was rendered for (a cluster-wide object: all
of them), and the digest is not written, so the next step tries again. No answer, 409, 429 or
5xx raise :class:`~clusters.providers.base.ProviderError` (retryable).

Nothing runs the GPU Operator or the DRA driver in a hosted cluster: its nodes are KWOK's and
its hosts simulated. The objects are validated and stored by the cluster's real API, as a
tenant would find them on a real cluster; what they configure (MIG layouts, sharing, drivers)
the simulated hosts take from NVKE's own desired state, and the Nodes show what the hosts'
agents report (:mod:`nodepools.tenant_nodes`).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..providers.base import NodePoolSpec, ProviderError
from ..providers.clusterapi import render
from ..providers.clusterapi.client import ApiError, KubeApi
from ..providers.clusterapi.render import (
    CLUSTER_POLICY,
    CLUSTER_POLICY_NAME,
    COMPUTE_DOMAIN,
    CONFIG_MAP,
    CUSTOM_RESOURCE_DEFINITION,
    GPU_OPERATOR_NAMESPACE,
    MANAGED_BY,
    NVIDIA_DRIVER,
)

CRD_DIR = Path(__file__).resolve().parents[1] / "providers" / "crds"
DIGEST_ANNOTATION = "nvke.io/addons-digest"
ESTABLISHED_WAIT_S = 15.0
#: where NVKE's objects of each rendered kind are looked for (None: every namespace), in the
#: order they are deleted: the ClusterPolicy last
OWNED = (
    (CONFIG_MAP, GPU_OPERATOR_NAMESPACE),
    (COMPUTE_DOMAIN, None),
    (NVIDIA_DRIVER, None),
    (CLUSTER_POLICY, None),
)


@functools.cache
def crds() -> tuple[dict[str, Any], ...]:
    """The vendored CRDs, parsed (libyaml when available)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return tuple(yaml.load(p.read_text(), Loader=loader) for p in sorted(CRD_DIR.glob("*.yaml")))


@functools.cache
def _crds_digest() -> str:
    texts = (p.read_bytes() for p in sorted(CRD_DIR.glob("*.yaml")))
    return hashlib.sha256(b"".join(hashlib.sha256(t).digest() for t in texts)).hexdigest()[:16]


@dataclass(frozen=True)
class Rendered:
    """One object to apply and the pools it is rendered for."""

    obj: dict[str, Any]
    pools: tuple[uuid.UUID, ...]


def _key(kind: str, namespace: str | None, name: str) -> tuple[str, str, str]:
    return kind, namespace or "", name


def _key_of(obj: dict[str, Any]) -> tuple[str, str, str]:
    meta = obj["metadata"]
    return _key(obj["kind"], meta.get("namespace"), meta["name"])


def render_cluster(pools: list[NodePoolSpec]) -> list[Rendered]:
    """Every object of ``pools`` in the order it is applied: ConfigMaps (merged across pools),
    then drivers and ComputeDomains, the ClusterPolicy last."""
    objects: dict[tuple[str, str, str], dict[str, Any]] = {}
    owners: dict[tuple[str, str, str], list[uuid.UUID]] = {}
    for pool in sorted(pools, key=lambda p: p.name):
        configmaps = {k[2]: o for k, o in objects.items() if k[0] == CONFIG_MAP.kind}
        for obj in render.render_gpu_operator(pool, configmaps):
            key = _key_of(obj)
            objects[key] = obj
            owners.setdefault(key, []).append(pool.id)
    order = sorted(objects, key=lambda k: (k[0] == CLUSTER_POLICY.kind, k[0] != CONFIG_MAP.kind, k))
    return [Rendered(objects[k], tuple(owners[k])) for k in order]


def digest(rendered: list[Rendered]) -> str:
    return render.digest([_crds_digest(), [r.obj for r in rendered]], size=16)


def sync(kube: KubeApi, pools: list[NodePoolSpec]) -> dict[uuid.UUID, str]:
    """Make the API behind ``kube`` hold exactly the add-ons of ``pools`` among NVKE's (see
    the module doc); returns the API's refusals by pool id ({} when everything was applied)."""
    rendered = render_cluster(pools)
    wanted = digest(rendered)
    policy = kube.get(CLUSTER_POLICY, CLUSTER_POLICY_NAME)  # None also without the CRD
    if policy is None and not rendered:
        return {}
    annotations = (policy or {}).get("metadata", {}).get("annotations") or {}
    if policy is not None and annotations.get(DIGEST_ANNOTATION) == wanted:
        return {}
    refused: dict[uuid.UUID, list[str]] = {}
    if rendered:
        try:
            _install_crds(kube)
        except ApiError as exc:
            if exc.retryable:
                raise
            return {p.id: str(exc) for p in pools}
        namespaces = {r.obj["metadata"].get("namespace") for r in rendered}
        for namespace in sorted(n for n in namespaces if n and n != "default"):
            kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        for item in rendered:
            obj = item.obj
            if obj["kind"] == CLUSTER_POLICY.kind and not refused:
                obj = copy.deepcopy(obj)
                obj["metadata"].setdefault("annotations", {})[DIGEST_ANNOTATION] = wanted
            try:
                kube.apply(obj)
            except ApiError as exc:
                if exc.retryable:
                    raise
                for pool_id in item.pools:
                    refused.setdefault(pool_id, []).append(str(exc))
    _delete_unrendered(kube, {_key_of(r.obj) for r in rendered})
    return {pool_id: "; ".join(messages) for pool_id, messages in refused.items()}


def _install_crds(kube: KubeApi) -> None:
    """Apply the vendored CRDs; return once the API serves each of them (Established)."""
    pending = [crd["metadata"]["name"] for crd in crds() if not _established(kube.apply(crd))]
    deadline = time.monotonic() + ESTABLISHED_WAIT_S
    while pending:
        if time.monotonic() > deadline:
            raise ProviderError(
                f"the cluster's API has not established the CRDs {', '.join(pending)} "
                f"within {ESTABLISHED_WAIT_S:.0f} s",
                code="cluster_api_error",
            )
        time.sleep(0.2)
        pending = [
            name for name in pending if not _established(kube.get(CUSTOM_RESOURCE_DEFINITION, name))
        ]


def _established(crd: dict[str, Any] | None) -> bool:
    conditions = ((crd or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


def _delete_unrendered(kube: KubeApi, keep: set[tuple[str, str, str]]) -> None:
    for kind, namespace in OWNED:
        for obj in kube.list(kind, namespace, label_selector=MANAGED_BY):
            meta = obj.get("metadata") or {}
            # items of a core list carry no ``kind``: the key is built from the Kind asked for
            if _key(kind.kind, meta.get("namespace"), meta["name"]) not in keep:
                kube.delete(kind, meta["name"], meta.get("namespace"))
