"""The command-line equivalent of each portal form: the ``nvkectl`` command (cli/nvkectl, where
it has one) and the ``curl`` call of the REST API the form's view goes through.

Every function returns ``{"nvkectl": str | None, "curl": str}``; values are shell-quoted
(:func:`shlex.quote`). ``$NVKE`` is the server URL and ``$TOKEN`` an API key, as in the
README's tour. The API paths are the ones ``clusters/api/urls.py`` and
``nodepools/api/urls.py`` route; the nvkectl commands exist in ``cli/nvkectl/main.py``
(``clusters create|upgrade|delete``, ``nodepools create|scale|upgrade|delete``).
"""

from __future__ import annotations

import json
import shlex
from typing import Any

_AUTH = '-H "Authorization: Bearer $TOKEN"'


def _curl(method: str, path: str, body: dict[str, Any] | None = None) -> str:
    parts = ["curl -sf", f"-X {method}" if method != "GET" else "", _AUTH]
    if body is not None:
        parts += ['-H "Content-Type: application/json"', "-d " + shlex.quote(json.dumps(body))]
    parts.append(f'"$NVKE/api/v1/{path}"')
    return " ".join(p for p in parts if p)


def _q(value: Any) -> str:
    return shlex.quote(str(value))


def cluster_create(name: str = "NAME", version: str = "VERSION", region: str = "REGION") -> dict:
    """``POST /clusters``."""
    body = {"name": name, "kubernetes_version": version, "region": region}
    return {
        "nvkectl": f"nvkectl clusters create {_q(name)} -k {_q(version)} -r {_q(region)} --wait",
        "curl": _curl("POST", "clusters", body),
    }


def cluster_upgrade(cluster, version: str = "VERSION") -> dict:
    """``PATCH /clusters/<id>`` with ``kubernetes_version``."""
    return {
        "nvkectl": f"nvkectl clusters upgrade {_q(cluster.name)} -k {_q(version)} --wait",
        "curl": _curl("PATCH", f"clusters/{cluster.id}", {"kubernetes_version": version}),
    }


def cluster_delete(cluster) -> dict:
    """``DELETE /clusters/<id>``."""
    return {
        "nvkectl": f"nvkectl clusters delete {_q(cluster.name)} --wait",
        "curl": _curl("DELETE", f"clusters/{cluster.id}"),
    }


def maintenance_policy(cluster, policy: dict[str, Any]) -> dict:
    """``PATCH /clusters/<id>`` with ``maintenance_policy`` (nvkectl has no command for it)."""
    return {
        "nvkectl": None,
        "curl": _curl("PATCH", f"clusters/{cluster.id}", {"maintenance_policy": policy}),
    }


def _pool_path(pool) -> str:
    return f"clusters/{pool.cluster_id}/nodepools/{pool.id}"


def nodepool_create(cluster, body: dict[str, Any] | None = None) -> dict:
    """``POST /clusters/<id>/nodepools``; nvkectl covers exclusive and one-profile MIG pools."""
    body = body or {
        "name": "NAME",
        "gpu_model": "GPU_MODEL",
        "gpus_per_node": 1,
        "node_count": 1,
        "isolation": {"mode": "exclusive"},
    }
    iso = body.get("isolation") or {"mode": "exclusive"}
    cli = None
    if iso.get("mode") == "exclusive" or set(iso) == {"mode", "mig_profile"}:
        cli = (
            f"nvkectl nodepools create {_q(cluster.name)} {_q(body['name'])}"
            f" --gpu-model {_q(body['gpu_model'])} --gpus-per-node {body['gpus_per_node']}"
            f" --nodes {body['node_count']}"
            + (f" --mig-profile {_q(iso['mig_profile'])}" if iso.get("mode") == "mig" else "")
            + " --wait"
        )
    return {"nvkectl": cli, "curl": _curl("POST", f"clusters/{cluster.id}/nodepools", body)}


def nodepool_scale(pool, node_count: int | str = "N") -> dict:
    """``POST …/nodepools/<id>/set-size``."""
    return {
        "nvkectl": (
            f"nvkectl nodepools scale {_q(pool.cluster.name)} {_q(pool.name)} --nodes {node_count}"
        ),
        "curl": _curl("POST", _pool_path(pool) + "/set-size", {"node_count": node_count}),
    }


def nodepool_isolation(pool, isolation: dict[str, Any]) -> dict:
    """``PATCH …/nodepools/<id>`` with ``isolation`` (nvkectl has no command for it)."""
    return {"nvkectl": None, "curl": _curl("PATCH", _pool_path(pool), {"isolation": isolation})}


def nodepool_upgrade(pool, version: str = "VERSION") -> dict:
    """``POST …/nodepools/<id>/upgrade``."""
    return {
        "nvkectl": (
            f"nvkectl nodepools upgrade {_q(pool.cluster.name)} {_q(pool.name)} -k {_q(version)}"
        ),
        "curl": _curl("POST", _pool_path(pool) + "/upgrade", {"kubernetes_version": version}),
    }


def nodepool_delete(pool) -> dict:
    """``DELETE …/nodepools/<id>``."""
    return {
        "nvkectl": f"nvkectl nodepools delete {_q(pool.cluster.name)} {_q(pool.name)} --wait",
        "curl": _curl("DELETE", _pool_path(pool)),
    }
