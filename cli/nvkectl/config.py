"""Contexts (server URL + API key) in a YAML file readable by its owner only (0600).

File: ``$NVKECTL_CONFIG`` or ``~/.config/nvkectl/config.yaml``::

    current-context: prod
    contexts:
      prod: {server: https://nvke.example.com, api_key: "<prefix>.<secret>"}
    merged-contexts:        # what get-credentials merged, so clusters delete can remove it
      <cluster id>: {kubeconfig: /home/me/.kube/config, context: nvke_acme_us-east-1_train}
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml


class ConfigError(Exception):
    """No such context, or no context at all (exit code 2)."""


@dataclass(frozen=True)
class Context:
    name: str
    server: str
    api_key: str


def config_path() -> Path:
    env = os.environ.get("NVKECTL_CONFIG")
    return Path(env) if env else Path.home() / ".config" / "nvkectl" / "config.yaml"


def load() -> dict[str, Any]:
    path = config_path()
    if not path.exists():
        return {"contexts": {}, "current-context": None}
    data = yaml.safe_load(path.read_text()) or {}
    data.setdefault("contexts", {})
    data.setdefault("current-context", None)
    return data


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` created with mode 0600 (and chmod an existing file to it):
    the file holds secrets, so it is never readable by others, not even for a moment."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.chmod(path, 0o600)


def save(data: dict[str, Any]) -> None:
    write_private(config_path(), yaml.safe_dump(data, sort_keys=False))


def set_context(name: str, *, server: str, api_key: str) -> None:
    data = load()
    data["contexts"][name] = {"server": server.rstrip("/"), "api_key": api_key}
    if not data["current-context"]:
        data["current-context"] = name
    save(data)


def use_context(name: str) -> None:
    data = load()
    if name not in data["contexts"]:
        raise ConfigError(f"no context named {name!r} in {config_path()}")
    data["current-context"] = name
    save(data)


def resolve(name: str | None) -> Context:
    """The named context, else ``$NVKECTL_CONTEXT``, else the current one."""
    data = load()
    name = name or os.environ.get("NVKECTL_CONTEXT") or data["current-context"]
    if not name:
        raise ConfigError(
            "no context: run `nvkectl config set-context NAME --server URL --api-key KEY`"
        )
    entry = data["contexts"].get(name)
    if entry is None:
        raise ConfigError(f"no context named {name!r} in {config_path()}")
    return Context(name=name, server=entry["server"], api_key=entry["api_key"])


def remember_merged(cluster_id: str, *, kubeconfig: Path, context: str) -> None:
    """Record that ``get-credentials`` merged ``context`` for ``cluster_id`` into ``kubeconfig``."""
    data = load()
    merged = data.setdefault("merged-contexts", {}) or {}
    merged[cluster_id] = {"kubeconfig": str(kubeconfig), "context": context}
    data["merged-contexts"] = merged
    save(data)


def forget_merged(cluster_id: str) -> dict[str, str] | None:
    """Drop and return the record of :func:`remember_merged` for ``cluster_id`` (None: none)."""
    data = load()
    found = (data.get("merged-contexts") or {}).pop(cluster_id, None)
    if found is not None:
        save(data)
    return found
