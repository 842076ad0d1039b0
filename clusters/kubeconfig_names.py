"""One name per cluster credential: ``nvke_<tenant>_<region>_<cluster>``.

The kubeconfig the API serves names its cluster, context and user entries this way (whatever
the provider wrote), and ``nvkectl get-credentials`` merges it under the same names, so two
tenants' ``prod`` clusters, or one tenant's ``prod`` in two regions, never overwrite each other
in ``~/.kube/config`` (GKE's ``gke_<project>_<location>_<cluster>`` convention).
"""

from __future__ import annotations

import re

import yaml

_UNSAFE = re.compile(r"[^a-z0-9-]+")


def _part(text: str) -> str:
    return _UNSAFE.sub("-", text.lower()).strip("-") or "-"


def context_name(*, tenant: str, region: str, cluster: str) -> str:
    """``nvke_acme-ai_us-east-1_train``: parts lower-cased, all but ``[a-z0-9-]`` -> ``-``."""
    return "_".join(["nvke", _part(tenant), _part(region), _part(cluster)])


def rename_kubeconfig(text: str, name: str) -> str:
    """The kubeconfig with its (first) cluster, user and context all named ``name`` and that
    context current. Raises ValueError when the text is not a kubeconfig with one context."""
    config = yaml.safe_load(text)
    if not isinstance(config, dict) or not config.get("contexts"):
        raise ValueError("not a kubeconfig with a context")
    context = config["contexts"][0]
    old_cluster = context["context"]["cluster"]
    old_user = context["context"]["user"]
    for entry in config.get("clusters", []):
        if entry["name"] == old_cluster:
            entry["name"] = name
    for entry in config.get("users", []):
        if entry["name"] == old_user:
            entry["name"] = name
    context["name"] = name
    context["context"]["cluster"] = name
    context["context"]["user"] = name
    config["contexts"] = [context]
    config["current-context"] = name
    return yaml.safe_dump(config, sort_keys=False)
