"""Kubernetes version rules (Kubernetes version skew policy,
https://kubernetes.io/releases/version-skew-policy/):

* the control plane is upgraded one minor version at a time, never downgraded;
* a node (kubelet) is never newer than the control plane (kube-apiserver) and at most
  three minor versions older (since Kubernetes 1.28; it was two before);
* new clusters and upgrades only go to versions the catalog lists as supported today.
"""

from __future__ import annotations

from datetime import date

from catalog.models import KubernetesVersion
from catalog.services import (
    UnsupportedKubernetesVersion,
    check_kubernetes_version,
    supported_kubernetes_versions,
)
from nvke.errors import InvalidInput

MAX_NODE_MINOR_SKEW = 3


def minor(version: str) -> tuple[int, int]:
    """``"1.34"`` / ``"1.34.2"`` / ``"v1.34.2"`` -> ``(1, 34)``. Raises ValueError."""
    parts = version.lstrip("v").split(".")
    return int(parts[0]), int(parts[1])


def complete(version: str, control_plane: str) -> str:
    """``version`` as a kubelet of that release runs it: a bare minor that the control plane
    runs is completed with the control plane's patch (``"1.36"`` under ``"1.36.3"`` ->
    ``"1.36.3"``); a patch version, another minor, or a control plane that names only its
    minor (Cluster API's ``KubeadmControlPlane.status.version`` read as ``1.36``) leave it as
    it is. NVKE runs one patch release per minor (the hosted control planes' binaries:
    ``deploy/k8s/v1.36/go.mod`` pins ``k8s.io/kubernetes v1.36.3``), so a node of the control
    plane's minor runs that patch: a node pool upgraded to ``"1.36"`` stores ``"1.36.3"``, the
    version its Nodes' ``kubeletVersion`` says (issue 33: API, portal and nvkectl said
    ``1.36`` where kubectl said ``v1.36.3``)."""
    version, control_plane = version.strip().lstrip("v"), control_plane.strip().lstrip("v")
    if version.count(".") == 1 and control_plane.startswith(version + "."):
        return control_plane
    return version


def control_plane_upgrade_problem(current: str, target: str) -> str | None:
    """Why the control plane cannot go from ``current`` to ``target``, or None."""
    cur, tgt = minor(current), minor(target)
    if tgt < cur:
        return f"downgrades are not supported ({current} -> {target})"
    if tgt[0] != cur[0] or tgt[1] - cur[1] > 1:
        return f"the control plane upgrades one minor version at a time ({current} -> {target})"
    return None


def node_version_problem(control_plane: str, node: str) -> str | None:
    """Why nodes cannot run ``node`` under a control plane at ``control_plane``, or None."""
    cp, nd = minor(control_plane), minor(node)
    if nd > cp:
        return f"nodes cannot be newer than the control plane ({node} > {control_plane})"
    if cp[0] != nd[0] or cp[1] - nd[1] > MAX_NODE_MINOR_SKEW:
        return (
            f"nodes may be at most {MAX_NODE_MINOR_SKEW} minor versions older than the control "
            f"plane ({node} under {control_plane})"
        )
    return None


def available_upgrades(
    current: str,
    today: date | None = None,
    *,
    supported: list[KubernetesVersion] | None = None,
) -> list[str]:
    """Supported versions the control plane can be upgraded to next (newest first).
    ``supported``: the catalog's supported versions when the caller has read them already."""
    out = []
    if supported is None:
        supported = supported_kubernetes_versions(today)
    for version in supported:
        name = version.version
        if minor(name) > minor(current) and control_plane_upgrade_problem(current, name) is None:
            out.append(name)
    return out


def end_of_life(version: str) -> date | None:
    """The end-of-life date of ``version``'s minor, or None when the catalog does not know it."""
    row = KubernetesVersion.objects.filter(version="{}.{}".format(*minor(version))).first()
    return row.end_of_life if row else None


def require_supported(version: str) -> KubernetesVersion:
    """The catalog row of a supported ``version``; InvalidInput
    ``unsupported_kubernetes_version`` (field ``kubernetes_version``, with the supported list)."""
    try:
        return check_kubernetes_version(version)
    except UnsupportedKubernetesVersion as exc:
        raise InvalidInput(
            str(exc),
            code="unsupported_kubernetes_version",
            field="kubernetes_version",
            extra={"supported_versions": exc.supported},
        ) from exc
