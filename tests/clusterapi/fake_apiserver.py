"""SIMULATION: a small local HTTP server that plays a Cluster API management cluster (and the
workload clusters it creates) for exactly the calls NVKE's ``clusterapi`` provider makes.

It is NOT a Kubernetes API server and nothing here has been checked against one. It answers:

* ``PATCH`` with ``application/apply-patch+yaml`` (server-side apply: creates or updates;
  ``fieldManager`` required; fields the same manager applied before and now omits are removed,
  a simplification of SSA field ownership; ``metadata.resourceVersion`` in the body is a
  precondition: 409 when it differs), ``application/merge-patch+json`` (RFC 7386) and
  ``application/strategic-merge-patch+json`` (treated as a merge patch);
* ``GET`` of one object and of lists (equality label selectors, ``spec.nodeName`` /
  ``metadata.name`` field selectors), ``DELETE``, and ``POST .../pods/{name}/eviction``
  (429 for a pod labelled ``nvke-test/pdb-blocked=true``, as a PodDisruptionBudget would);
* under ``/workload/<cluster name>`` the same API for that workload cluster.

Every request is recorded (method, path, query, content type, body) for assertions.

Controllers are simulated too, synchronously and crudely (:class:`SimulatedControllers`):

* Cluster API: a ``Cluster`` is reported ready (InfrastructureReady, ControlPlaneAvailable,
  Available True; ``spec.controlPlaneEndpoint`` set; the ``<name>-kubeconfig`` Secret
  written) once it has been applied a second time, i.e. one reconcile after its creation;
  a ``KubeadmControlPlane`` reports its ``spec.version`` as ``status.version`` (a new
  version: rolling, 0 replicas up to date, at the first read; rolled at the second); a
  ``MachineDeployment`` gets Machines for its ``replicas`` (``Provisioning`` until they are
  first listed, then ``Running`` with a Node in the workload cluster registered with the
  ``node-labels`` and taints of the ``KubeadmConfigTemplate``); scaling down deletes Machines
  annotated ``cluster.x-k8s.io/delete-machine`` first, then the newest; deleting a ``Cluster``
  sets ``deletionTimestamp`` and removes it with everything labelled with its name at the next
  read;
* GPU Operator: MIG Manager sets ``nvidia.com/mig.config.state`` (``success`` when the named
  config is in ``nvke-mig-parted-config`` or is ``all-disabled``, else ``failed``); GPU Feature
  Discovery labels ``gpu.count`` / ``mig-<profile>.count`` / ``gpu.replicas`` /
  ``gpu.sharing-strategy`` / ``gfd.timestamp`` from that config, the device-plugin config and
  :attr:`FakeApiServer.gpus_per_node`.
"""

from __future__ import annotations

import base64
import copy
import itertools
import json
import re
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

MANAGEMENT = "management"
TOKEN = "simulated-token"

_PREFIX = re.compile(r"^/workload/(?P<cluster>[^/]+)(?P<rest>/.*)$")
_APIS = re.compile(
    r"^/apis/(?P<group>[^/]+)/(?P<version>[^/]+)(?:/namespaces/(?P<ns>[^/]+))?"
    r"/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?/?$"
)
_CORE = re.compile(
    r"^/api/v1(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[^/]+)"
    r"(?:/(?P<name>[^/]+)(?:/(?P<sub>eviction))?)?/?$"
)
_CLUSTER_SCOPED = {"nodes", "clusterpolicies", "nvidiadrivers", "namespaces"}


@dataclass
class Request:
    method: str
    cluster: str
    path: str
    query: dict[str, list[str]]
    content_type: str
    body: Any
    authorization: str


@dataclass
class Failure:
    method: str
    path: re.Pattern[str]
    status: int
    times: int = 1


@dataclass
class Route:
    cluster: str
    group: str
    version: str
    namespace: str
    plural: str
    name: str
    sub: str = ""

    def key(self, name: str | None = None) -> tuple[str, str, str, str, str]:
        return (self.cluster, self.group, self.plural, self.namespace, name or self.name)


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _drop_omitted(stored: dict, before: dict, after: dict) -> None:
    """Remove from ``stored`` the map keys the manager applied ``before`` but not ``after``."""
    for key, old in before.items():
        if key not in after:
            stored.pop(key, None)
        elif (
            isinstance(old, dict)
            and isinstance(after[key], dict)
            and isinstance(stored.get(key), dict)
        ):
            _drop_omitted(stored[key], old, after[key])


def status_body(code: int, message: str, reason: str = "") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Status",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }


class ApiFailure(Exception):
    def __init__(self, code: int, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.code, self.message, self.reason = code, message, reason


@dataclass
class FakeApiServer:
    """The SIMULATED API server (see the module docstring). Use as a context manager."""

    gpus_per_node: int = 1
    #: MIG configs MIG Manager fails to apply (to exercise failures)
    failing_mig_configs: set[str] = field(default_factory=set)
    objects: dict[tuple[str, str, str, str, str], dict] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    #: last object each (field manager, key) applied, for removing omitted fields
    applied: dict[tuple[str, tuple], dict] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.lock = threading.RLock()
        self._rv = itertools.count(1)
        self._uid = itertools.count(1)
        self.controllers = SimulatedControllers(self)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                return

            def _handle(self) -> None:
                code, body = server.handle(self)
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_PATCH = do_POST = do_DELETE = do_PUT = _handle

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FakeApiServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def kubeconfig(self, prefix: str = "", name: str = "management") -> str:
        return yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": name, "cluster": {"server": self.url + prefix}}],
                "users": [{"name": "nvke", "user": {"token": TOKEN}}],
                "contexts": [{"name": name, "context": {"cluster": name, "user": "nvke"}}],
                "current-context": name,
            }
        )

    # -- test helpers ----------------------------------------------------------------------------

    def fail(self, method: str, path: str, status: int, times: int = 1) -> None:
        """Answer the next ``times`` requests matching ``method`` and regex ``path`` with
        ``status``."""
        self.failures.append(Failure(method, re.compile(path), status, times))

    def find(
        self, plural: str, name: str | None = None, *, cluster: str = MANAGEMENT
    ) -> list[dict]:
        with self.lock:
            return [
                copy.deepcopy(obj)
                for (c, _g, p, _ns, n), obj in sorted(self.objects.items())
                if c == cluster and p == plural and (name is None or n == name)
            ]

    def one(self, plural: str, name: str, *, cluster: str = MANAGEMENT) -> dict:
        found = self.find(plural, name, cluster=cluster)
        assert len(found) == 1, (plural, name, cluster, len(found))
        return found[0]

    def put(self, cluster: str, obj: dict) -> dict:
        """Store an object directly (as another controller or a tenant would create it)."""
        group, _, _version = obj["apiVersion"].rpartition("/")
        plural = obj["kind"].lower() + "s"
        meta = obj["metadata"]
        route = Route(cluster, group, "", meta.get("namespace", ""), plural, meta["name"])
        with self.lock:
            stored = self._stamp(copy.deepcopy(obj), None)
            self.objects[route.key()] = stored
            return stored

    def calls(self, method: str | None = None, path: str = "") -> list[Request]:
        return [
            r
            for r in self.requests
            if (method is None or r.method == method) and re.search(path, r.path)
        ]

    # -- request handling ------------------------------------------------------------------------

    def handle(self, handler: BaseHTTPRequestHandler) -> tuple[int, Any]:
        parts = urlsplit(handler.path)
        query = parse_qs(parts.query)
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        content_type = (handler.headers.get("Content-Type") or "").split(";")[0].strip()
        try:
            body = yaml.safe_load(raw) if raw else None  # JSON is YAML
        except yaml.YAMLError:
            body = raw.decode(errors="replace")
        match = _PREFIX.match(parts.path)
        cluster, rest = (match["cluster"], match["rest"]) if match else (MANAGEMENT, parts.path)
        request = Request(
            handler.command,
            cluster,
            parts.path,
            query,
            content_type,
            body,
            handler.headers.get("Authorization", ""),
        )
        with self.lock:
            self.requests.append(request)
            for failure in self.failures:
                if (
                    failure.times > 0
                    and failure.method == handler.command
                    and failure.path.search(parts.path)
                ):
                    failure.times -= 1
                    return failure.status, status_body(failure.status, "injected failure")
            if request.authorization != f"Bearer {TOKEN}":
                return 401, status_body(401, "Unauthorized", "Unauthorized")
            try:
                route = self._route(cluster, rest)
                return 200, self._dispatch(request, route)
            except ApiFailure as exc:
                return exc.code, status_body(exc.code, exc.message, exc.reason)

    def _route(self, cluster: str, path: str) -> Route:
        if m := _APIS.match(path):
            return Route(
                cluster, m["group"], m["version"], m["ns"] or "", m["plural"], m["name"] or ""
            )
        if m := _CORE.match(path):
            return Route(
                cluster, "", "v1", m["ns"] or "", m["plural"], m["name"] or "", m["sub"] or ""
            )
        raise ApiFailure(404, f"the server could not find the requested resource {path}")

    def _dispatch(self, request: Request, route: Route) -> Any:
        method = request.method
        if method == "GET" and route.name:
            return copy.deepcopy(self._get(route))
        if method == "GET":
            return self._list(route, request.query)
        if method == "PATCH":
            return copy.deepcopy(self._patch(route, request))
        if method == "POST" and route.sub == "eviction":
            return self._evict(route)
        if method == "DELETE":
            return self._delete(route)
        raise ApiFailure(405, f"{method} is not simulated")

    def _get(self, route: Route) -> dict:
        self.controllers.observe(route)
        obj = self.objects.get(route.key())
        if obj is None:
            raise ApiFailure(404, f'{route.plural} "{route.name}" not found', "NotFound")
        return obj

    def _list(self, route: Route, query: dict[str, list[str]]) -> dict:
        self.controllers.observe(route)
        labels = {}
        for part in (query.get("labelSelector") or [""])[0].split(","):
            if part:
                key, _, value = part.partition("=")
                labels[key] = value
        fields = {}
        for part in (query.get("fieldSelector") or [""])[0].split(","):
            if part:
                key, _, value = part.partition("=")
                fields[key] = value
        items = []
        for (c, g, p, ns, _n), obj in sorted(self.objects.items()):
            if (c, g, p) != (route.cluster, route.group, route.plural):
                continue
            if route.namespace and ns != route.namespace:
                continue
            have = obj["metadata"].get("labels") or {}
            if any(have.get(k) != v for k, v in labels.items()):
                continue
            if (
                "spec.nodeName" in fields
                and (obj.get("spec") or {}).get("nodeName") != fields["spec.nodeName"]
            ):
                continue
            if "metadata.name" in fields and obj["metadata"]["name"] != fields["metadata.name"]:
                continue
            items.append(copy.deepcopy(obj))
        return {"kind": "List", "apiVersion": "v1", "metadata": {}, "items": items}

    def _stamp(self, obj: dict, previous: dict | None) -> dict:
        meta = obj.setdefault("metadata", {})
        meta["resourceVersion"] = str(next(self._rv))
        if previous is None:
            meta.setdefault("uid", f"uid-{next(self._uid)}")
            meta.setdefault("creationTimestamp", now_rfc3339())
            meta["generation"] = 1
        else:
            for key in ("uid", "creationTimestamp", "deletionTimestamp"):
                if key in previous["metadata"]:
                    meta[key] = previous["metadata"][key]
            changed = previous.get("spec") != obj.get("spec")
            meta["generation"] = previous["metadata"].get("generation", 1) + int(changed)
        return obj

    def _patch(self, route: Route, request: Request) -> dict:
        key = route.key()
        current = self.objects.get(key)
        body = request.body if isinstance(request.body, dict) else None
        if body is None:
            raise ApiFailure(400, "the body of a patch must be an object")
        if request.content_type == "application/apply-patch+yaml":
            manager = (request.query.get("fieldManager") or [""])[0]
            if not manager:
                raise ApiFailure(400, "fieldManager is required for apply patch", "BadRequest")
            group, _, version = body.get("apiVersion", "").rpartition("/")
            if (group, version) != (route.group, route.version) or body.get("metadata", {}).get(
                "name"
            ) != route.name:
                raise ApiFailure(400, "apiVersion or name of the body do not match the URL")
            wanted_rv = body.get("metadata", {}).get("resourceVersion")
            if wanted_rv and (
                current is None or current["metadata"]["resourceVersion"] != wanted_rv
            ):
                raise ApiFailure(
                    409,
                    "Operation cannot be fulfilled: the object has been modified",
                    "Conflict",
                )
            applied = copy.deepcopy(body)
            applied.get("metadata", {}).pop("resourceVersion", None)
            merged = merge_patch(current or {}, applied)
            previous = self.applied.get((manager, key))
            if previous is not None:
                _drop_omitted(merged, previous, applied)
            self.applied[(manager, key)] = applied
        elif request.content_type in (
            "application/merge-patch+json",
            "application/strategic-merge-patch+json",
        ):
            if current is None:
                raise ApiFailure(404, f'{route.plural} "{route.name}" not found', "NotFound")
            merged = merge_patch(current, body)
        else:
            raise ApiFailure(415, f"unsupported patch type {request.content_type!r}")
        if route.namespace:
            merged["metadata"]["namespace"] = route.namespace
        stored = self._stamp(merged, current)
        self.objects[key] = stored
        self.controllers.changed(route, stored, created=current is None)
        return self.objects[key]

    def _evict(self, route: Route) -> dict:
        pod = self.objects.get(route.key())
        if pod is None:
            raise ApiFailure(404, f'pods "{route.name}" not found', "NotFound")
        if (pod["metadata"].get("labels") or {}).get("nvke-test/pdb-blocked") == "true":
            raise ApiFailure(
                429,
                "Cannot evict pod as it would violate the pod's disruption budget.",
                "TooManyRequests",
            )
        pod["metadata"].setdefault("deletionTimestamp", now_rfc3339())
        return status_body(201, "evicted") | {"status": "Success"}

    def _delete(self, route: Route) -> dict:
        obj = self.objects.get(route.key())
        if obj is None:
            raise ApiFailure(404, f'{route.plural} "{route.name}" not found', "NotFound")
        if route.plural == "clusters" and route.group == "cluster.x-k8s.io":
            obj["metadata"].setdefault("deletionTimestamp", now_rfc3339())  # deleted when seen
        else:
            del self.objects[route.key()]
            self.controllers.deleted(route, obj)
        return {"kind": "Status", "apiVersion": "v1", "status": "Success"}

    # used by the controllers
    def store(self, route: Route, obj: dict) -> dict:
        stored = self._stamp(obj, self.objects.get(route.key(obj["metadata"]["name"])))
        self.objects[route.key(obj["metadata"]["name"])] = stored
        return stored


def _condition(type_: str, status: str, reason: str, message: str = "") -> dict:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": now_rfc3339(),
    }


class SimulatedControllers:
    """SIMULATED Cluster API and GPU Operator controllers (see the module docstring)."""

    def __init__(self, server: FakeApiServer) -> None:
        self.server = server
        self.applies: dict[str, int] = {}
        self.seen_machines: set[str] = set()
        self.rolling: set[tuple] = set()

    def _r(self, cluster: str, group: str, plural: str, ns: str = "") -> Route:
        return Route(cluster, group, "", ns, plural, "")

    # -- events ----------------------------------------------------------------------------------

    def changed(self, route: Route, obj: dict, *, created: bool) -> None:
        if route.cluster == MANAGEMENT and route.group == "cluster.x-k8s.io":
            if route.plural == "clusters":
                self.applies[route.name] = self.applies.get(route.name, 0) + 1
                if self.applies[route.name] >= 2:
                    self._cluster_ready(route, obj)
                elif created:
                    obj["status"] = {
                        "phase": "Provisioning",
                        "conditions": [
                            _condition("InfrastructureReady", "False", "NotReady", "provisioning"),
                            _condition("ControlPlaneAvailable", "False", "NotAvailable"),
                        ],
                    }
            elif route.plural == "machinedeployments":
                self._reconcile_deployment(route, obj)
        if route.cluster == MANAGEMENT and route.plural == "kubeadmcontrolplanes":
            replicas = obj["spec"].get("replicas", 1)
            old = (obj.get("status") or {}).get("version")
            obj["status"] = {
                "version": old or obj["spec"]["version"],
                "replicas": replicas,
                "readyReplicas": replicas,
                "upToDateReplicas": replicas,
                "observedGeneration": obj["metadata"]["generation"],
                "initialization": {"controlPlaneInitialized": True},
            }
            if old and old != obj["spec"]["version"]:  # an upgrade: rolled at the next read
                obj["status"]["upToDateReplicas"] = 0
        if route.cluster != MANAGEMENT and route.plural in ("nodes", "configmaps"):
            self._gpu_operator(route.cluster)

    def deleted(self, route: Route, obj: dict) -> None:
        if route.cluster == MANAGEMENT and route.plural == "machinedeployments":
            obj["spec"]["replicas"] = 0
            self._reconcile_deployment(route, obj)

    def observe(self, route: Route) -> None:
        """A read: machines first listed become Running; pods evicted are gone; a deleting
        Cluster is removed with what it owns."""
        server = self.server
        if route.cluster == MANAGEMENT and route.plural == "machines":
            for key, machine in list(server.objects.items()):
                if key[2] == "machines" and key[0] == MANAGEMENT:
                    self._machine_running(machine)
        if route.plural == "pods":
            for key, pod in list(server.objects.items()):
                if key[2] == "pods" and pod["metadata"].get("deletionTimestamp"):
                    del server.objects[key]  # an evicted pod has terminated by the next look
        if route.cluster == MANAGEMENT and route.plural == "kubeadmcontrolplanes" and route.name:
            obj = server.objects.get(route.key())
            if obj is not None and obj["status"]["version"] != obj["spec"]["version"]:
                if obj["status"]["upToDateReplicas"] == 0 and route.key() in self.rolling:
                    obj["status"]["version"] = obj["spec"]["version"]
                    obj["status"]["upToDateReplicas"] = obj["spec"].get("replicas", 1)
                    self.rolling.discard(route.key())
                else:
                    self.rolling.add(route.key())  # the first look sees it rolling
        if route.cluster == MANAGEMENT and route.plural == "clusters" and route.name:
            obj = server.objects.get(route.key())
            if obj is not None and obj["metadata"].get("deletionTimestamp"):
                self._cascade_delete(route.name)

    # -- Cluster API -------------------------------------------------------------------------

    def _cluster_ready(self, route: Route, cluster: dict) -> None:
        name = cluster["metadata"]["name"]
        cluster["spec"]["controlPlaneEndpoint"] = {"host": f"{name}.cp.capi.test", "port": 6443}
        cluster["status"] = {
            "phase": "Provisioned",
            "initialization": {"infrastructureProvisioned": True, "controlPlaneInitialized": True},
            "conditions": [
                _condition("InfrastructureReady", "True", "Ready"),
                _condition("ControlPlaneAvailable", "True", "Available"),
                _condition("Available", "True", "Available"),
            ],
        }
        kubeconfig = self.server.kubeconfig(prefix=f"/workload/{name}", name=name)
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": f"{name}-kubeconfig",
                "namespace": route.namespace,
                "labels": {"cluster.x-k8s.io/cluster-name": name},
            },
            "type": "cluster.x-k8s.io/secret",
            "data": {"value": base64.b64encode(kubeconfig.encode()).decode()},
        }
        self.server.store(self._r(MANAGEMENT, "", "secrets", route.namespace), secret)

    def _template_registration(self, deployment: dict) -> tuple[dict[str, str], list[dict]]:
        ref = deployment["spec"]["template"]["spec"]["bootstrap"]["configRef"]
        ns = deployment["metadata"]["namespace"]
        template = self.server.objects.get(
            (MANAGEMENT, "bootstrap.cluster.x-k8s.io", "kubeadmconfigtemplates", ns, ref["name"])
        )
        if template is None:
            return {}, []
        registration = template["spec"]["template"]["spec"]["joinConfiguration"]["nodeRegistration"]
        labels: dict[str, str] = {}
        for arg in registration.get("kubeletExtraArgs") or []:
            if arg["name"] == "node-labels":
                for pair in arg["value"].split(","):
                    key, _, value = pair.partition("=")
                    labels[key] = value
        return labels, list(registration.get("taints") or [])

    def _reconcile_deployment(self, route: Route, deployment: dict) -> None:
        server = self.server
        name = deployment["metadata"]["name"]
        ns = deployment["metadata"]["namespace"]
        machines = [
            (key, m)
            for key, m in server.objects.items()
            if key[0] == MANAGEMENT
            and key[2] == "machines"
            and (m["metadata"].get("labels") or {}).get("cluster.x-k8s.io/deployment-name") == name
        ]
        want = deployment["spec"].get("replicas", 0)
        cluster = deployment["spec"]["clusterName"]
        if len(machines) > want:
            marked = [
                m
                for m in machines
                if "cluster.x-k8s.io/delete-machine" in (m[1]["metadata"].get("annotations") or {})
            ]
            rest = sorted(
                (m for m in machines if m not in marked),
                key=lambda m: m[1]["metadata"]["creationTimestamp"] + m[1]["metadata"]["name"],
                reverse=True,
            )
            for key, machine in (marked + rest)[: len(machines) - want]:
                del server.objects[key]
                node = machine["metadata"]["name"]
                server.objects.pop((cluster, "", "nodes", "", node), None)
        for _ in range(want - len(machines)):
            index = next(server._uid)
            machine_name = f"{name}-{index:05d}"
            template = deployment["spec"]["template"]
            machine = {
                "apiVersion": "cluster.x-k8s.io/v1beta2",
                "kind": "Machine",
                "metadata": {
                    "name": machine_name,
                    "namespace": ns,
                    "labels": {
                        **template["metadata"]["labels"],
                        "cluster.x-k8s.io/cluster-name": cluster,
                        "cluster.x-k8s.io/deployment-name": name,
                    },
                },
                "spec": copy.deepcopy(template["spec"]),
                "status": {
                    "phase": "Provisioning",
                    "conditions": [_condition("NodeReady", "Unknown", "NodeDoesNotExist")],
                },
            }
            server.store(self._r(MANAGEMENT, "cluster.x-k8s.io", "machines", ns), machine)

    def _machine_running(self, machine: dict) -> None:
        name = machine["metadata"]["name"]
        if machine["status"].get("phase") != "Provisioning":
            return
        if name not in self.seen_machines:  # Provisioning the first time it is listed
            self.seen_machines.add(name)
            return
        cluster = machine["spec"]["clusterName"]
        deployment = self.server.objects.get(
            (
                MANAGEMENT,
                "cluster.x-k8s.io",
                "machinedeployments",
                machine["metadata"]["namespace"],
                machine["metadata"]["labels"]["cluster.x-k8s.io/deployment-name"],
            )
        )
        labels, taints = self._template_registration(deployment) if deployment else ({}, [])
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {**labels, "kubernetes.io/hostname": name}},
            "spec": {"taints": taints} if taints else {},
            "status": {"conditions": [_condition("Ready", "True", "KubeletReady")]},
        }
        self.server.store(self._r(cluster, "", "nodes"), node)
        machine["status"] = {
            "phase": "Running",
            "nodeRef": {"name": name},
            "conditions": [
                _condition("NodeReady", "True", "NodeReady"),
                _condition("Ready", "True", "Ready"),
            ],
        }
        self._gpu_operator(cluster)

    def _cascade_delete(self, name: str) -> None:
        server = self.server
        for key, obj in list(server.objects.items()):
            if key[0] != MANAGEMENT:
                continue
            labels = obj["metadata"].get("labels") or {}
            if labels.get("cluster.x-k8s.io/cluster-name") == name or (
                key[2] == "clusters" and key[4] == name
            ):
                del server.objects[key]
        for key in [k for k in server.objects if k[0] == name]:
            del server.objects[key]

    # -- GPU Operator ------------------------------------------------------------------------

    def _config(self, cluster: str, name: str) -> dict:
        return self.server.objects.get((cluster, "", "configmaps", "gpu-operator", name)) or {}

    def _gpu_operator(self, cluster: str) -> None:
        """MIG Manager and GFD: label every GPU node of the workload cluster."""
        server = self.server
        parted_text = (self._config(cluster, "nvke-mig-parted-config").get("data") or {}).get(
            "config.yaml"
        )
        parted = yaml.safe_load(parted_text) if parted_text else {}
        plugin = self._config(cluster, "nvke-device-plugin-config").get("data") or {}
        for key, node in list(server.objects.items()):
            if key[0] != cluster or key[2] != "nodes":
                continue
            labels = node["metadata"].setdefault("labels", {})
            if "nvke.io/nodepool-id" not in labels:
                continue
            before = dict(labels)
            devices: dict[str, int] = {}
            config = labels.get("nvidia.com/mig.config")
            if config:
                entries = (parted.get("mig-configs") or {}).get(config)
                if config in server.failing_mig_configs or (
                    entries is None and config != "all-disabled"
                ):
                    labels["nvidia.com/mig.config.state"] = "failed"
                    continue
                labels["nvidia.com/mig.config.state"] = "success"
                for entry in entries or []:
                    if entry.get("mig-enabled"):
                        for profile, count in (entry.get("mig-devices") or {}).items():
                            devices[profile] = devices.get(profile, 0) + count
            doc = (
                yaml.safe_load(
                    plugin.get(labels.get("nvidia.com/device-plugin.config", ""), "") or "{}"
                )
                or {}
            )
            strategy = (doc.get("flags") or {}).get("migStrategy", "none")
            for label in [k for k in labels if re.match(r"nvidia\.com/mig-.*\.count$", k)]:
                del labels[label]
            gpus = server.gpus_per_node
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
            if labels != before:
                labels["nvidia.com/gfd.timestamp"] = str(int(time.time()) + 1)
