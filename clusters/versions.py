"""Kubernetes version rules (Kubernetes version skew policy,
https://kubernetes.io/releases/version-skew-policy/):

* the control plane is upgraded one minor version at a time, never downgraded;
* a node (kubelet) is never newer than the control plane (kube-apiserver) and at most
  three minor versions older (since Kubernetes 1.28; it was two before);
* new clusters and upgrades only go to versions the catalog lists as supported today, and
  that the cluster's provider can run (:meth:`clusters.providers.base.Provider.kubernetes_minors`:
  the ``hosted`` provider runs only the minors NVKE builds binaries of).
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


def provider_minors(provider: str) -> tuple[str, ...] | None:
    """The minors provider ``provider`` can run (``("1.36", "1.37")``), None for any."""
    from .providers import get_provider

    return get_provider(provider).kubernetes_minors()


def runnable(
    supported: list[KubernetesVersion], minors: tuple[str, ...] | None
) -> list[KubernetesVersion]:
    """Of ``supported``, those ``minors`` (:func:`provider_minors`) include, in order."""
    return list(supported) if minors is None else [v for v in supported if v.version in minors]


def runnable_versions(provider: str, today: date | None = None) -> list[KubernetesVersion]:
    """Versions a cluster of provider ``provider`` can be created with or upgraded to on
    ``today``: supported by the catalog and run by the provider (newest first)."""
    return runnable(supported_kubernetes_versions(today), provider_minors(provider))


def available_upgrades(
    current: str,
    today: date | None = None,
    *,
    supported: list[KubernetesVersion] | None = None,
    provider: str | None = None,
) -> list[str]:
    """Supported versions the control plane can be upgraded to next (newest first), of those
    ``provider`` runs (None: any). ``supported``: the catalog's supported versions when the
    caller has read them already."""
    out = []
    if supported is None:
        supported = supported_kubernetes_versions(today)
    if provider is not None:
        supported = runnable(supported, provider_minors(provider))
    for version in supported:
        name = version.version
        if minor(name) > minor(current) and control_plane_upgrade_problem(current, name) is None:
            out.append(name)
    return out


def end_of_life(version: str) -> date | None:
    """The end-of-life date of ``version``'s minor, or None when the catalog does not know it."""
    row = KubernetesVersion.objects.filter(version="{}.{}".format(*minor(version))).first()
    return row.end_of_life if row else None


def require_supported(version: str, provider: str | None = None) -> KubernetesVersion:
    """The catalog row of a supported ``version`` that ``provider`` (a cluster's) can run;
    InvalidInput ``unsupported_kubernetes_version`` (field ``kubernetes_version``, with
    ``supported_versions``: those the provider runs, newest first) otherwise. ``provider``
    None: the catalog alone decides."""
    minors = provider_minors(provider) if provider is not None else None
    try:
        row = check_kubernetes_version(version)
    except UnsupportedKubernetesVersion as exc:
        if minors is not None:  # name what can be run, not what upstream supports
            exc = UnsupportedKubernetesVersion(
                version, [m for m in exc.supported if m in minors], exc.reason
            )
        raise _refusal(exc) from exc
    if minors is not None and row.version not in minors:
        offered = [v.version for v in runnable(supported_kubernetes_versions(), minors)]
        raise _refusal(
            UnsupportedKubernetesVersion(
                version,
                offered,
                f"cannot be run by this installation's {provider!r} provider "
                f"(it runs Kubernetes {', '.join(minors) or 'none'})",
            )
        )
    return row


def _refusal(exc: UnsupportedKubernetesVersion) -> InvalidInput:
    return InvalidInput(
        str(exc),
        code="unsupported_kubernetes_version",
        field="kubernetes_version",
        extra={"supported_versions": exc.supported},
    )
