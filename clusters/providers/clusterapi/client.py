"""Calls to a Kubernetes API server with the official ``kubernetes`` client.

:class:`KubeApi` wraps one API server (the management cluster, or a workload cluster) and
makes exactly the calls the provider uses:

* ``apply(obj)``: server-side apply (``PATCH`` with ``application/apply-patch+yaml``,
  ``fieldManager=nvke``, ``force=true``: NVKE owns the fields it renders; a body carrying
  ``metadata.resourceVersion`` makes the apply conditional, 409 when the object changed);
* ``get`` / ``list`` (label and field selectors) / ``delete`` of custom objects (Cluster API,
  GPU Operator, CustomResourceDefinitions) and of ConfigMaps, Secrets, Namespaces, Nodes and
  Pods;
* ``merge_patch`` (``application/merge-patch+json``, RFC 7386) for small edits of objects
  other controllers own (a Machine's annotations, a Node's labels and ``unschedulable``);
* ``evict`` (``POST pods/{name}/eviction``, policy/v1), which honours PodDisruptionBudgets.

Objects go in and come out as plain dicts. Errors become :class:`ProviderError`: 401/403 and
422 (``clusterapi_unauthorized`` / ``clusterapi_invalid_object``) are not retryable; 404 of a
read is ``None``; 409, 429, 5xx and connection failures are retryable
(``clusterapi_conflict`` / ``clusterapi_unavailable``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

import urllib3
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from ..base import ProviderError
from .render import FIELD_MANAGER, Kind, kind_of

#: (connect, read) timeouts in seconds for every call: a reconcile step must not hang
TIMEOUT = (5.0, 30.0)
APPLY = "application/apply-patch+yaml"
MERGE_PATCH = "application/merge-patch+json"

#: CoreV1Api method names per plural: (read, patch, list, list all namespaces, delete)
_CORE = {
    "configmaps": (
        "read_namespaced_config_map",
        "patch_namespaced_config_map",
        "list_namespaced_config_map",
        "list_config_map_for_all_namespaces",
        "delete_namespaced_config_map",
    ),
    "secrets": (
        "read_namespaced_secret",
        "patch_namespaced_secret",
        "list_namespaced_secret",
        "list_secret_for_all_namespaces",
        "delete_namespaced_secret",
    ),
    "nodes": ("read_node", "patch_node", "list_node", "list_node", "delete_node"),
    "namespaces": (
        "read_namespace",
        "patch_namespace",
        "list_namespace",
        "list_namespace",
        "delete_namespace",
    ),
    "services": (
        "read_namespaced_service",
        "patch_namespaced_service",
        "list_namespaced_service",
        "list_service_for_all_namespaces",
        "delete_namespaced_service",
    ),
    "persistentvolumeclaims": (
        "read_namespaced_persistent_volume_claim",
        "patch_namespaced_persistent_volume_claim",
        "list_namespaced_persistent_volume_claim",
        "list_persistent_volume_claim_for_all_namespaces",
        "delete_namespaced_persistent_volume_claim",
    ),
    "pods": (
        "read_namespaced_pod",
        "patch_namespaced_pod",
        "list_namespaced_pod",
        "list_pod_for_all_namespaces",
        "delete_namespaced_pod",
    ),
}


class ApiError(ProviderError):
    """A call to a Kubernetes API server failed; ``status`` is the HTTP status (0: no answer)."""

    def __init__(self, message: str, *, status: int, retryable: bool, code: str) -> None:
        super().__init__(message, retryable=retryable, code=code)
        self.status = status


def _error(exc: Exception, what: str) -> ApiError:
    if isinstance(exc, ApiException):
        status = exc.status or 0
        reason = exc.reason or ""
        with contextlib.suppress(TypeError, ValueError, AttributeError):
            reason = json.loads(exc.body or "{}").get("message") or reason
        message = f"{what}: HTTP {status} {reason}".strip()
        if status in (401, 403):
            return ApiError(message, status=status, retryable=False, code="clusterapi_unauthorized")
        if status in (400, 422):
            return ApiError(
                message, status=status, retryable=False, code="clusterapi_invalid_object"
            )
        if status == 409:
            return ApiError(message, status=status, retryable=True, code="clusterapi_conflict")
        return ApiError(message, status=status, retryable=True, code="clusterapi_unavailable")
    return ApiError(
        f"{what}: {type(exc).__name__}: {exc}",
        status=0,
        retryable=True,
        code="clusterapi_unavailable",
    )


_TRANSPORT_ERRORS = (ApiException, urllib3.exceptions.HTTPError, OSError)


class KubeApi:
    """One Kubernetes API server, spoken to with ``kubernetes.client``."""

    def __init__(self, api_client: k8s.ApiClient, *, name: str = "management cluster") -> None:
        self.api_client = api_client
        self.name = name
        self.custom = k8s.CustomObjectsApi(api_client)
        self.core = k8s.CoreV1Api(api_client)

    # -- helpers ---------------------------------------------------------------------------------

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, _request_timeout=TIMEOUT, **kwargs)
        except _TRANSPORT_ERRORS as exc:
            raise _error(exc, f"{what} on the {self.name}") from exc

    def _core(self, kind: Kind, slot: int) -> Callable[..., Any]:
        return getattr(self.core, _CORE[kind.plural][slot])

    @staticmethod
    def _decode(response: Any) -> dict[str, Any]:
        data = response.data if hasattr(response, "data") else response
        return json.loads(data) if isinstance(data, bytes | str) else dict(data or {})

    @staticmethod
    def _where(kind: Kind, name: str, namespace: str | None) -> str:
        place = f"{namespace}/" if kind.namespaced and namespace else ""
        return f"{kind.kind} {place}{name}"

    # -- calls -----------------------------------------------------------------------------------

    def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply ``obj`` (created when missing); returns the object as stored."""
        kind = kind_of(obj)
        meta = obj["metadata"]
        name, namespace = meta["name"], meta.get("namespace")
        what = f"apply {self._where(kind, name, namespace)}"
        options = {"field_manager": FIELD_MANAGER, "force": True, "_content_type": APPLY}
        body = dict(obj)
        if not kind.group:
            args = (name, namespace, body) if kind.namespaced else (name, body)
            return self._decode(
                self._call(what, self._core(kind, 1), *args, _preload_content=False, **options)
            )
        if kind.namespaced:
            return self._call(
                what,
                self.custom.patch_namespaced_custom_object,
                kind.group,
                kind.version,
                namespace,
                kind.plural,
                name,
                body,
                **options,
            )
        return self._call(
            what,
            self.custom.patch_cluster_custom_object,
            kind.group,
            kind.version,
            kind.plural,
            name,
            body,
            **options,
        )

    def merge_patch(
        self, kind: Kind, name: str, patch: Mapping[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        """JSON merge patch (RFC 7386: ``None`` removes a key) of an existing object."""
        what = f"patch {self._where(kind, name, namespace)}"
        options = {"_content_type": MERGE_PATCH}
        if not kind.group:
            args = (name, namespace, dict(patch)) if kind.namespaced else (name, dict(patch))
            return self._decode(
                self._call(what, self._core(kind, 1), *args, _preload_content=False, **options)
            )
        if kind.namespaced:
            return self._call(
                what,
                self.custom.patch_namespaced_custom_object,
                kind.group,
                kind.version,
                namespace,
                kind.plural,
                name,
                dict(patch),
                **options,
            )
        return self._call(
            what,
            self.custom.patch_cluster_custom_object,
            kind.group,
            kind.version,
            kind.plural,
            name,
            dict(patch),
            **options,
        )

    def get(self, kind: Kind, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """The object, or None when it does not exist (404)."""
        what = f"read {self._where(kind, name, namespace)}"
        try:
            if not kind.group:
                args = (name, namespace) if kind.namespaced else (name,)
                return self._decode(
                    self._call(what, self._core(kind, 0), *args, _preload_content=False)
                )
            if kind.namespaced:
                return self._call(
                    what,
                    self.custom.get_namespaced_custom_object,
                    kind.group,
                    kind.version,
                    namespace,
                    kind.plural,
                    name,
                )
            return self._call(
                what,
                self.custom.get_cluster_custom_object,
                kind.group,
                kind.version,
                kind.plural,
                name,
            )
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def list(
        self,
        kind: Kind,
        namespace: str | None = None,
        *,
        label_selector: Mapping[str, str] | None = None,
        field_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        """Objects of ``kind`` (in ``namespace``, or everywhere when None) matching the
        selectors; a kind the server does not know answers []."""
        what = f"list {kind.plural}"
        options: dict[str, Any] = {}
        if label_selector:
            options["label_selector"] = ",".join(f"{k}={v}" for k, v in label_selector.items())
        if field_selector:
            options["field_selector"] = field_selector
        try:
            if not kind.group:
                if kind.namespaced and namespace:
                    fn, args = self._core(kind, 2), (namespace,)
                else:
                    fn, args = self._core(kind, 3), ()
                result = self._decode(
                    self._call(what, fn, *args, _preload_content=False, **options)
                )
            elif kind.namespaced and namespace:
                result = self._call(
                    what,
                    self.custom.list_namespaced_custom_object,
                    kind.group,
                    kind.version,
                    namespace,
                    kind.plural,
                    **options,
                )
            else:
                result = self._call(
                    what,
                    self.custom.list_cluster_custom_object,
                    kind.group,
                    kind.version,
                    kind.plural,
                    **options,
                )
        except ApiError as exc:
            if exc.status == 404:
                return []
            raise
        return list((result or {}).get("items") or [])

    def delete(self, kind: Kind, name: str, namespace: str | None = None) -> bool:
        """Ask for the object's deletion (background propagation); False when already gone."""
        what = f"delete {self._where(kind, name, namespace)}"
        options = {"propagation_policy": "Background"}
        try:
            if not kind.group:
                args = (name, namespace) if kind.namespaced else (name,)
                self._call(what, self._core(kind, 4), *args, _preload_content=False, **options)
            elif kind.namespaced:
                self._call(
                    what,
                    self.custom.delete_namespaced_custom_object,
                    kind.group,
                    kind.version,
                    namespace,
                    kind.plural,
                    name,
                    **options,
                )
            else:
                self._call(
                    what,
                    self.custom.delete_cluster_custom_object,
                    kind.group,
                    kind.version,
                    kind.plural,
                    name,
                    **options,
                )
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def evict(self, name: str, namespace: str) -> str:
        """Evict a pod through the Eviction API: ``evicted``, ``gone`` (404) or ``blocked``
        (429: a PodDisruptionBudget does not allow it now; 500: several budgets match)."""
        body = k8s.V1Eviction(
            api_version="policy/v1",
            kind="Eviction",
            metadata=k8s.V1ObjectMeta(name=name, namespace=namespace),
        )
        try:
            self._call(
                f"evict pod {namespace}/{name}",
                self.core.create_namespaced_pod_eviction,
                name,
                namespace,
                body,
                _preload_content=False,
            )
        except ApiError as exc:
            if exc.status == 404:
                return "gone"
            if exc.status in (429, 500):
                return "blocked"
            raise
        return "evicted"


# --- clients -----------------------------------------------------------------------------------

_clients: dict[str, k8s.ApiClient] = {}
_lock = threading.Lock()


def _cached(key: str, make: Callable[[], k8s.ApiClient]) -> k8s.ApiClient:
    with _lock:
        api_client = _clients.get(key)
        if api_client is None:
            api_client = _clients[key] = make()
        return api_client


def management_api(kubeconfig_path: str) -> KubeApi:
    """The management cluster named by the kubeconfig file (re-read when the file changes)."""
    if not kubeconfig_path:
        raise ProviderError(
            "the Cluster API provider is not configured (NVKE_CLUSTERAPI_KUBECONFIG is empty)",
            retryable=False,
            code="clusterapi_not_configured",
        )
    try:
        stamp = os.stat(kubeconfig_path).st_mtime_ns
    except OSError as exc:
        raise ProviderError(
            f"cannot read the management cluster's kubeconfig {kubeconfig_path}: {exc}",
            retryable=False,
            code="clusterapi_not_configured",
        ) from exc

    def make() -> k8s.ApiClient:
        return k8s_config.new_client_from_config(config_file=kubeconfig_path, persist_config=False)

    return KubeApi(_cached(f"file:{kubeconfig_path}:{stamp}", make))


def workload_api(kubeconfig_text: str, *, name: str) -> KubeApi:
    """A workload cluster, from the kubeconfig Cluster API wrote for it."""
    try:
        config_dict = yaml.safe_load(kubeconfig_text)
    except yaml.YAMLError as exc:
        raise ProviderError(
            f"the kubeconfig of {name} is not YAML: {exc}", code="clusterapi_bad_kubeconfig"
        ) from exc
    key = "dict:" + hashlib.sha256(kubeconfig_text.encode()).hexdigest()

    def make() -> k8s.ApiClient:
        return k8s_config.new_client_from_config_dict(config_dict, persist_config=False)

    try:
        api_client = _cached(key, make)
    except (k8s_config.ConfigException, KeyError, TypeError) as exc:
        raise ProviderError(
            f"the kubeconfig of {name} cannot be used: {exc}", code="clusterapi_bad_kubeconfig"
        ) from exc
    return KubeApi(api_client, name=f"workload cluster {name}")
