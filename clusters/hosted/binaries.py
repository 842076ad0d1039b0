"""Where the Kubernetes binaries of hosted control planes are, and building them when missing.

``deploy/k8s/build.sh`` is the one builder (one Go build cache for every Kubernetes binary NVKE
uses); this module only asks it where a target's folder is (``--dir``), checks the files, and
starts it in the background when something is missing, reading its progress line so a cluster
that waits can say what it waits for.
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

from django.conf import settings

BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "build.sh"
CONTROL_PLANE_BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
TARGET_BINARIES = {"etcd": ("etcd", "etcdctl"), "kwok": ("kwok",)}
#: KWOK's Stages (its module's own stage files) in the kwok target's folder
KWOK_STAGES = "stages.yaml"


def target_of(version: str) -> str:
    """The build target of a Kubernetes version: ``"1.36.3"`` / ``"1.36"`` -> ``"v1.36"``."""
    parts = version.lstrip("v").split(".")
    return f"v{parts[0]}.{parts[1]}"


def supported_targets() -> list[str]:
    """The targets ``deploy/k8s`` pins (``["etcd", "kwok", "v1.36", "v1.37"]``)."""
    return sorted(p.name for p in BUILD_SCRIPT.parent.iterdir() if (p / "go.mod").is_file())


def kubernetes_minors() -> tuple[str, ...]:
    """The Kubernetes minors ``deploy/k8s`` pins control-plane binaries of (``("1.36",
    "1.37")``, oldest first): the only ones a hosted control plane can run."""
    minors = [t[1:] for t in supported_targets() if t.startswith("v")]
    return tuple(sorted(minors, key=lambda m: tuple(int(p) for p in m.split("."))))


def _root() -> Path:
    configured = getattr(settings, "NVKE_K8S_BIN_ROOT", "")
    if configured:
        return Path(configured)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "nvke" / "k8s"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["NVKE_K8S_BIN_ROOT"] = str(_root())
    return env


@functools.lru_cache(maxsize=16)
def target_dir(target: str) -> Path:
    """The folder ``deploy/k8s/build.sh`` builds ``target`` into (its ``bin/`` holds the
    binaries; cached: the folder depends only on the checkout). Raises ValueError for a
    target ``deploy/k8s`` does not pin."""
    if target not in supported_targets():
        raise ValueError(f"NVKE builds no Kubernetes binaries for {target!r}")
    out = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--dir", target],
        capture_output=True,
        text=True,
        env=_env(),
        check=True,
    )
    return Path(out.stdout.strip())


def binary(target: str, name: str) -> Path | None:
    """The path of binary ``name`` of ``target`` when it is built, else None."""
    path = target_dir(target) / "bin" / name
    return path if path.is_file() and os.access(path, os.X_OK) else None


def missing(target: str) -> list[str]:
    """The binaries of ``target`` not built yet (``[]`` when all are there)."""
    names = TARGET_BINARIES.get(target, (*CONTROL_PLANE_BINARIES, "kubectl"))
    out = [n for n in names if binary(target, n) is None]
    if target == "kwok" and not kwok_stages().is_file():
        out.append(KWOK_STAGES)
    return out


def kwok_stages() -> Path:
    """The file of KWOK's Stages the builder copied from the ``sigs.k8s.io/kwok`` module it
    built ``kwok`` from (node-initialize, node-heartbeat-with-lease, pod-ready, pod-complete,
    pod-delete)."""
    return target_dir("kwok") / KWOK_STAGES


def build_progress() -> str:
    """The builder's current progress line ("building kube-apiserver v1.37.2 (2/4): 3m10s
    elapsed, ~4m left; ...") or "" when nothing is building."""
    try:
        return (_root() / "progress").read_text().strip()
    except OSError:
        return ""


def start_build(targets: list[str], log_path: Path) -> subprocess.Popen:
    """Start ``deploy/k8s/build.sh targets...`` in the background (its output to
    ``log_path``); the builder holds a lock, so a second build waits for the first."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        return subprocess.Popen(
            ["bash", str(BUILD_SCRIPT), *targets],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_env(),
            start_new_session=True,
        )
