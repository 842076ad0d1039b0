"""Merge a downloaded kubeconfig into the user's, replacing entries of the same name, and
take a deleted cluster's entries out again.

The API names the cluster, user and context of each kubeconfig ``nvke_<tenant>_<region>_<cluster>``
(unique per cluster), so merging never touches another cluster's entries. ``get-credentials``
records which context it merged for which cluster id (``merged-contexts`` in nvkectl's own
config, :mod:`nvkectl.config`), and ``clusters delete`` removes that context, as ``gcloud
container clusters delete`` removes its kubeconfig entry.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from .config import write_private


def default_path() -> Path:
    env = os.environ.get("KUBECONFIG", "")
    first = env.split(os.pathsep)[0] if env else ""
    return Path(first) if first else Path.home() / ".kube" / "config"


def merge(existing: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``existing`` with every cluster/user/context of ``new`` added or replaced by name and
    ``current-context`` set to ``new``'s."""
    out = dict(existing) if existing else {"apiVersion": "v1", "kind": "Config"}
    out.setdefault("apiVersion", "v1")
    out.setdefault("kind", "Config")
    out.setdefault("preferences", {})
    for section in ("clusters", "users", "contexts"):
        entries = {e["name"]: e for e in (out.get(section) or [])}
        for entry in new.get(section) or []:
            entries[entry["name"]] = entry
        out[section] = list(entries.values())
    out["current-context"] = new["current-context"]
    return out


def merge_into(path: Path, text: str) -> str:
    """Merge kubeconfig ``text`` into the file at ``path`` (created 0600); the context name."""
    new = yaml.safe_load(text)
    existing = yaml.safe_load(path.read_text()) if path.exists() else {}
    write_private(path, yaml.safe_dump(merge(existing or {}, new), sort_keys=False))
    return new["current-context"]


def remove(existing: dict[str, Any], context: str) -> dict[str, Any]:
    """``existing`` without the context named ``context`` and the cluster and user entries it
    names (unless another context still names them); ``current-context`` becomes ``""`` when it
    was that context. Unchanged when there is no such context."""
    contexts = existing.get("contexts") or []
    gone = next((c for c in contexts if c.get("name") == context), None)
    if gone is None:
        return existing
    out = dict(existing)
    out["contexts"] = [c for c in contexts if c is not gone]
    still = [c.get("context") or {} for c in out["contexts"]]
    for section, key in (("clusters", "cluster"), ("users", "user")):
        name = (gone.get("context") or {}).get(key)
        if name and not any(c.get(key) == name for c in still):
            out[section] = [e for e in out.get(section) or [] if e.get("name") != name]
    if out.get("current-context") == context:
        out["current-context"] = ""
    return out


def remove_from(path: Path, context: str) -> bool:
    """Remove ``context`` (and its cluster and user) from the kubeconfig at ``path``; whether
    it was there."""
    if not path.exists():
        return False
    existing = yaml.safe_load(path.read_text()) or {}
    after = remove(existing, context)
    if after is existing:
        return False
    write_private(path, yaml.safe_dump(after, sort_keys=False))
    return True
