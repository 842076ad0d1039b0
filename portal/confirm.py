"""Typed-name confirmations of destructive and disruptive actions, checked on the server.

A delete of a cluster or node pool, or an isolation change, runs only when the POST carries
``confirm_name`` equal to the object's name (the browser's ``pattern`` attribute is only a
convenience: the view refuses without it). :func:`disruption_of_cluster` /
:func:`disruption_of_pool` say what the action disrupts, counted from the live node rows (DELETED
nodes excluded): ``{"nodes": int, "gpus": int, "gpu_instances": int, "pools": int}`` (whole
GPUs apart from the GPU instances shared pools' nodes hold on shared GPUs).
"""

from __future__ import annotations

from django import forms

from clusters.choices import Phase
from nodepools.choices import NodePhase
from nodepools.models import Node, NodePool

#: the POST field that carries the typed name
FIELD = "confirm_name"


class ConfirmNameForm(forms.Form):
    """``confirm_name`` must equal ``name`` exactly (case and spaces included)."""

    confirm_name = forms.CharField(max_length=200, required=False, strip=False)

    def __init__(self, *args, name: str, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.expected = name
        field = self.fields[FIELD]
        field.label = f"Type {name} to confirm"
        field.widget.attrs.update({"autocomplete": "off", "spellcheck": "false"})

    def clean_confirm_name(self) -> str:
        value = self.cleaned_data.get(FIELD) or ""
        if value != self.expected:  # empty included: one message for "not typed" and "wrong"
            raise forms.ValidationError(
                f"type the name exactly ({self.expected})", code="confirmation_mismatch"
            )
        return value


def confirmed(data, name: str) -> ConfirmNameForm:
    """A bound :class:`ConfirmNameForm` for ``data`` (``request.POST``); call ``is_valid()``."""
    return ConfirmNameForm(data, name=name)


def _live_nodes(qs) -> dict[str, int]:
    """``nodes``, the whole ``gpus`` they hold and the ``gpu_instances`` VM nodes of shared
    pools hold on GPUs other tenants share (those GPUs are not theirs: four nodes of one
    1g.10gb instance each are 4 GPU instances, not "4 GPU(s)")."""
    from fleet.choices import GpuInstanceState
    from fleet.models import GpuInstance
    from fleet.shared_hosts import is_shared_policy

    rows = qs.exclude(phase=NodePhase.DELETED).values_list("id", "gpu_uuids", "nodepool__isolation")
    nodes = len(rows)
    shared = [node_id for node_id, _, iso in rows if is_shared_policy(iso or {})]
    gpus = sum(len(g or []) for _, g, iso in rows if not is_shared_policy(iso or {}))
    instances = GpuInstance.objects.filter(
        holder_id__in=shared, state=GpuInstanceState.ACTIVE
    ).count()
    return {"nodes": nodes, "gpus": gpus, "gpu_instances": instances}


def disruption_of_pool(pool: NodePool) -> dict[str, int]:
    """What deleting or re-partitioning ``pool`` disrupts: its live nodes and their GPUs."""
    return {"pools": 1, **_live_nodes(Node.objects.filter(nodepool=pool))}


def disruption_of_cluster(cluster) -> dict[str, int]:
    """What deleting ``cluster`` disrupts: its live node pools, their nodes and GPUs."""
    pools = NodePool.objects.filter(cluster=cluster).exclude(phase=Phase.DELETED).count()
    return {"pools": pools, **_live_nodes(Node.objects.filter(cluster=cluster))}
