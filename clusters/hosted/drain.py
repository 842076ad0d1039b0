"""Cordon and drain a Node of a hosted cluster through its real API, as ``kubectl drain`` does.

:func:`cordon` sets (or clears) the Node's ``spec.unschedulable``. :func:`evict_pods` takes one
look at the pods bound to the Node (``spec.nodeName``) and asks each to leave:

* through the **Eviction API** (``policy/v1`` ``Eviction``, the ``pods/eviction`` subresource),
  so kube-apiserver checks the pod's PodDisruptionBudget: a 429 answer leaves the pod where it
  is and names the budget from the answer's ``DisruptionBudget`` cause
  (``"default/web-1 (blocked by PodDisruptionBudget default/web-pdb: The disruption budget
  web-pdb needs 1 healthy pods and has 1 currently)"``); a 500 is the API's "more than one
  PodDisruptionBudget" refusal, named likewise;
* with ``force``, by DELETING the pod instead, as ``kubectl drain --disable-eviction`` does
  (budgets are not consulted); the pods deleted so are returned, for the caller to record;
* DaemonSet pods and mirror (static) pods are skipped, as kubectl drain skips them (their
  controller would put them straight back); a pod without a controller is refused without
  ``force`` (kubectl drain's "cannot delete Pods that declare no controller"), since nothing
  would bring it back elsewhere (a finished one is evicted, as kubectl drain does).

A pod already being deleted (``deletionTimestamp``) counts as still on the node until it is
gone (KWOK's pod-delete stage, a real kubelet, finishes it), so a drain is only complete once
the node holds nothing but skipped pods. Every call is idempotent: an eviction or deletion of a
pod that is already gone (404) is nothing to do.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..providers.base import Evictions

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
#: the cause kube-apiserver attaches to a refused eviction, naming the budget
_BUDGET = re.compile(r"The disruption budget (\S+) ")


def cordon(api, node_name: str, *, unschedulable: bool = True) -> bool:
    """Set the Node's ``spec.unschedulable`` (False: uncordon) through ``api`` (a
    ``kubernetes`` ApiClient). False when there is no such Node (nothing to cordon).
    Raises ``ApiException`` on any other refusal."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    try:
        client.CoreV1Api(api).patch_node(node_name, {"spec": {"unschedulable": unschedulable}})
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def skipped(pod: dict[str, Any]) -> bool:
    """A DaemonSet's pod or a mirror pod: kubectl drain leaves them."""
    meta = pod.get("metadata") or {}
    if MIRROR_ANNOTATION in (meta.get("annotations") or {}):
        return True
    return any(ref.get("kind") == "DaemonSet" for ref in meta.get("ownerReferences") or [])


def _refusal(exc, namespace: str) -> str:
    """Why kube-apiserver refused an eviction, naming the budget where the answer does."""
    try:
        body = json.loads(exc.body or "{}")
    except ValueError:
        body = {}
    causes = (body.get("details") or {}).get("causes") or []
    for cause in causes:
        message = cause.get("message") or ""
        match = _BUDGET.search(message)
        if match:
            return f"blocked by PodDisruptionBudget {namespace}/{match.group(1)}: {message}"
    return f"eviction refused ({exc.status}): {body.get('message') or exc.reason}"


def _pods_on(api, node_name: str) -> list[dict[str, Any]]:
    """The pods bound to ``node_name`` (``spec.nodeName``), as JSON, by namespace and name."""
    from kubernetes import client

    resp = client.CoreV1Api(api).list_pod_for_all_namespaces(
        field_selector=f"spec.nodeName={node_name}", _preload_content=False
    )
    return sorted(
        json.loads(resp.data)["items"],
        key=lambda p: (p["metadata"].get("namespace", ""), p["metadata"]["name"]),
    )


def pod_annotations(api, node_name: str, key: str) -> dict[str, str]:
    """``{"namespace/name": value}`` of annotation ``key`` on each pod bound to the Node that
    carries it (a workload's checkpoint ack, ``nvke.io/checkpointed``); one list call."""
    out = {}
    for pod in _pods_on(api, node_name):
        meta = pod["metadata"]
        value = (meta.get("annotations") or {}).get(key)
        if value is not None:
            out[f"{meta.get('namespace', 'default')}/{meta['name']}"] = value
    return out


def evict_pods(api, node_name: str, *, force: bool, dry_run: bool = False) -> Evictions:
    """Ask every pod on ``node_name`` to leave (see module doc); one look, no waiting.
    ``dry_run``: the evictions are asked with ``dryRun=All`` (kube-apiserver checks the
    budgets and changes nothing), and only the pods that would stay are returned.
    Raises ``ApiException`` when the API refuses something other than a budget (a 404 for a
    pod already gone is skipped)."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    core = client.CoreV1Api(api)
    pods = _pods_on(api, node_name)
    out = Evictions()
    for pod in pods:
        meta = pod["metadata"]
        namespace, name = meta.get("namespace", "default"), meta["name"]
        where = f"{namespace}/{name}"
        if skipped(pod):
            continue
        if meta.get("deletionTimestamp"):
            out.remaining.append(f"{where} (terminating)")
            continue
        try:
            if force and not dry_run:
                core.delete_namespaced_pod(name, namespace)
                out.deleted.append(where)
                out.remaining.append(f"{where} (terminating)")
                continue
            finished = (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
            if not meta.get("ownerReferences") and not finished:
                out.remaining.append(f"{where} (no controller: it would not come back)")
                continue
            if force:  # dry run of a forced drain: it would be deleted
                continue
            core.create_namespaced_pod_eviction(
                name,
                namespace,
                client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=namespace)),
                **({"dry_run": "All"} if dry_run else {}),
            )
        except ApiException as exc:
            if exc.status == 404:
                continue  # gone meanwhile
            if exc.status in (429, 500) and not force:
                out.remaining.append(f"{where} ({_refusal(exc, namespace)})")
                continue
            raise
        if dry_run:
            continue
        out.evicted.append(where)
        out.remaining.append(f"{where} (terminating)")
    return out
