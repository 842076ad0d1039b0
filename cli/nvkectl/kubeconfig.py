"""Merge a downloaded kubeconfig into the user's, replacing entries of the same name.

The API names the cluster, user and context of each kubeconfig ``nvke_<tenant>_<region>_<cluster>``
(unique per cluster), so merging never touches another cluster's entries.
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
