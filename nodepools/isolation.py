"""Validation of a node pool's isolation policy against the GPU catalog, and its per-GPU plan.

Shapes (DESIGN §10; every key besides ``mode`` optional unless said):

* ``{"mode": "exclusive"}`` — whole GPUs;
* ``{"mode": "mig", "mig_profile": "1g.10gb"}`` — one profile, as many instances as fit, on
  every GPU (the GPU Operator's ``single`` strategy);
* ``{"mode": "mig", "mig_layout": {"3g.47gb": 1, "1g.24gb": 1, "1g.12gb": 1}}`` — this layout
  on every GPU (``mixed`` strategy), placed by the real ``-lgipp`` placement table;
* ``{"mode": "vgpu", "vgpu_profile": "A10-12Q"}`` (as many as fit) or
  ``{"mode": "vgpu", "vgpu_layout": {"A10-4Q": 3, "A10-6Q": 2}}`` per GPU;
* ``{"mode": "time-slicing", "replicas": 4}`` (optionally ``"mig_profile"``: time-slice each
  MIG device of a ``single`` layout), ``{"mode": "mps", "replicas": 4}``;
* ``"tenancy": "dedicated"`` (default: the pool's GPUs serve this tenant only) or ``"shared"``
  (its MIG instances / MIG-backed vGPUs sit on a physical GPU of a *shared host* beside other
  tenants' — only MIG and vGPU isolate memory and faults, so time-slicing and MPS are refused,
  and so is a time-sliced vGPU type, which has no MIG instance to place; see
  :mod:`fleet.shared_hosts`).

Every refusal is an :class:`~nvke.errors.InvalidInput` (400 problem+json) with a stable
``code`` and the ``field`` at fault; the README's "GPU isolation" section lists them all.
Profile names are resolved per GPU model (aliases accepted, e.g. ``7g.79gb`` for A100-80GB's
``7g.80gb``); a profile is never inferred from the GiB number in its name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from catalog.mig import LayoutDoesNotFit, MigTable, Placement, max_instances_single, place_layout
from catalog.models import GpuModel, MigProfile, VgpuProfile
from catalog.services import (
    UnknownVgpuProfile,
    driver_problems,
    parse_driver_version,
    resolve_vgpu_profile,
)
from nvke.errors import InvalidInput

from .choices import IsolationMode

#: time-slicing replicas per GPU: 2 (1 would be exclusive) .. an NVKE sanity cap (the device
#: plugin itself sets no limit; "time-slicing: unlimited", MIG user guide "concepts").
TIME_SLICING_REPLICAS = (2, 256)
#: MPS clients per GPU: 2 .. 48 ("MPS 48 clients (logical)", MIG user guide "concepts").
MPS_REPLICAS = (2, 48)
TENANCIES = ("dedicated", "shared")

_KEYS = {
    IsolationMode.EXCLUSIVE: {"mode", "tenancy"},
    IsolationMode.MIG: {"mode", "tenancy", "mig_profile", "mig_layout"},
    IsolationMode.VGPU: {"mode", "tenancy", "vgpu_profile", "vgpu_layout"},
    IsolationMode.TIME_SLICING: {"mode", "tenancy", "replicas", "mig_profile"},
    IsolationMode.MPS: {"mode", "tenancy", "replicas", "mig_profile"},
}


@dataclass(frozen=True)
class IsolationPlan:
    """What one GPU of the pool becomes (every GPU of a pool is configured alike).

    ``mig_strategy``: ``none`` | ``single`` | ``mixed``; ``mig_placements``: the GPU
    instances of one GPU as (profile, start memory slice, size), in creation order, empty
    without MIG; ``sharing``: ``None`` or (``time-slicing`` | ``mps``, replicas);
    ``vgpu_devices``: ``{vGPU type: count}`` per GPU.
    """

    mode: str
    mig_strategy: str = "none"
    mig_placements: tuple[Placement, ...] = ()
    sharing: tuple[str, int] | None = None
    vgpu_devices: dict[str, int] = field(default_factory=dict)

    @property
    def mig_devices(self) -> dict[str, int]:
        """``{profile: count}`` per GPU, in creation order (largest first)."""
        out: dict[str, int] = {}
        for placement in self.mig_placements:
            out[placement.profile] = out.get(placement.profile, 0) + 1
        return out


def validate_isolation(gpu_model: GpuModel, isolation: Any) -> dict[str, Any]:
    """Return the normalised policy: canonical profile names, defaults dropped.

    Raises InvalidInput; see the module docstring and the README table for the codes.
    """
    policy, _ = _validate(gpu_model, isolation)
    return policy


def isolation_plan(gpu_model: GpuModel, policy: Mapping[str, Any]) -> IsolationPlan:
    """The per-GPU plan of a (normalised or raw) policy; raises InvalidInput like
    :func:`validate_isolation`."""
    return _validate(gpu_model, policy)[1]


def validate_driver(
    gpu_model: GpuModel,
    *,
    driver_version: str | None,
    cuda_version: str | None,
    policy: Mapping[str, Any],
) -> None:
    """Check a pool's driver against its GPU, its CUDA version and its MIG profiles.

    Without ``driver_version`` the GPU Operator's default driver is used and only a CUDA
    version is checked against it (:data:`DEFAULT_DRIVER_VERSION`). Raises InvalidInput
    (``invalid_driver_version``, ``unknown_driver_branch``, ``driver_architecture_unsupported``,
    ``driver_too_old_for_gpu``, ``driver_too_old_for_cuda``, ``unknown_cuda_version``,
    ``driver_too_old_for_mig_profile``).
    """
    text = driver_version or DEFAULT_DRIVER_VERSION
    try:
        driver = parse_driver_version(text)
    except ValueError as exc:
        raise InvalidInput(str(exc), code="invalid_driver_version", field="driver_version") from exc
    plan = isolation_plan(gpu_model, policy)
    names = {p.profile for p in plan.mig_placements}
    profiles = list(MigProfile.objects.filter(gpu_model=gpu_model, name__in=names))
    problems = driver_problems(gpu_model, driver, cuda_version=cuda_version, mig_profiles=profiles)
    if problems:
        first = problems[0]
        message = first.message
        if driver_version is None and first.field == "driver_version":
            message += f" (no driver_version given: the GPU Operator default {text} was checked)"
        raise InvalidInput(
            message,
            code=first.code,
            field=first.field,
            extra={"minimum": first.minimum} if first.minimum else None,
        )


#: The GPU Operator chart's default driver at the catalog snapshot (NVIDIA/gpu-operator
#: deployments/gpu-operator/values.yaml, commit a22dbf671f2e26f9a1e342f8eea28e196235e110).
DEFAULT_DRIVER_VERSION = "595.91.07"


# ---------------------------------------------------------------------------- internals


def _validate(gpu_model: GpuModel, isolation: Any) -> tuple[dict[str, Any], IsolationPlan]:
    if not isinstance(isolation, Mapping) or not isinstance(isolation.get("mode"), str):
        raise InvalidInput(
            'isolation must be an object with a "mode"', code="invalid_isolation", field="isolation"
        )
    mode = isolation["mode"]
    if mode not in IsolationMode.values:
        raise InvalidInput(
            f"unknown isolation mode {mode!r}; modes: {', '.join(IsolationMode.values)}",
            code="invalid_isolation",
            field="isolation.mode",
        )
    mode = IsolationMode(mode)
    extra = sorted(set(isolation) - _KEYS[mode])
    if extra:
        raise InvalidInput(
            f"unexpected isolation field(s) for mode {mode.value!r}: {', '.join(extra)}",
            code="invalid_isolation",
            field=f"isolation.{extra[0]}",
        )
    tenancy = _tenancy(mode, isolation.get("tenancy", "dedicated"))
    if mode == IsolationMode.EXCLUSIVE:
        policy, plan = {"mode": mode.value}, IsolationPlan(mode.value)
    elif mode == IsolationMode.MIG:
        policy, plan = _mig(gpu_model, isolation)
    elif mode == IsolationMode.VGPU:
        policy, plan = _vgpu(gpu_model, isolation)
    else:
        policy, plan = _sharing(gpu_model, mode, isolation)
    if tenancy != "dedicated":
        if not plan.mig_placements:  # a time-sliced vGPU type: no MIG instance to place
            raise InvalidInput(
                "tenancy 'shared' places MIG GPU instances on shared hosts; these vGPU types "
                "are time-sliced, not MIG-backed, so use a MIG-backed vGPU type or tenancy "
                "'dedicated'",
                code="shared_vgpu_not_mig_backed",
                field="isolation.tenancy",
            )
        policy["tenancy"] = tenancy
    return policy, plan


def _tenancy(mode: IsolationMode, tenancy: Any) -> str:
    if tenancy not in TENANCIES:
        raise InvalidInput(
            f"tenancy must be one of {', '.join(TENANCIES)}",
            code="invalid_isolation",
            field="isolation.tenancy",
        )
    if tenancy == "dedicated":
        return tenancy
    if mode in (IsolationMode.TIME_SLICING, IsolationMode.MPS):
        raise InvalidInput(
            f"{mode.value} gives no memory or fault isolation between the processes sharing a "
            "GPU, so it may not put two tenants on one physical GPU; only mig and vgpu may "
            "(tenancy 'shared')",
            code="cross_tenant_sharing_not_isolated",
            field="isolation.tenancy",
        )
    if mode == IsolationMode.EXCLUSIVE:
        raise InvalidInput(
            "exclusive gives whole GPUs to one tenant; tenancy 'shared' applies to mig and vgpu",
            code="invalid_isolation",
            field="isolation.tenancy",
        )
    # MIG / vGPU: hardware-isolated; placed as GPU instances on shared hosts
    # (fleet/shared_hosts.py); a time-sliced vGPU is refused by _validate below.
    return tenancy


def _mig_table(gpu_model: GpuModel) -> MigTable:
    if not gpu_model.mig_capable:
        raise InvalidInput(
            f"{gpu_model.name} does not support MIG (MIG support is a per-product fact: "
            "NVIDIA MIG user guide, supported GPUs); use mode 'exclusive', 'time-slicing' or "
            "'mps'",
            code="mig_not_supported",
            field="isolation.mode",
        )
    return MigTable.from_gpu_model(gpu_model)


def _profile_name(table: MigTable, name: Any, field_name: str) -> str:
    spec = table.profile(name.strip()) if isinstance(name, str) else None
    if spec is None:
        raise InvalidInput(
            f"MIG profile {name!r} does not exist on {table.gpu}; "
            f"valid profiles: {', '.join(table.names)}",
            code="unknown_mig_profile",
            field=field_name,
            extra={"valid_profiles": table.names},
        )
    return spec.name


def _single(table: MigTable, name: Any, field_name: str) -> tuple[str, tuple[Placement, ...]]:
    profile = _profile_name(table, name, field_name)
    count = max_instances_single(profile, table)
    return profile, tuple(place_layout({profile: count}, table))


def _mig(gpu_model: GpuModel, isolation: Mapping[str, Any]) -> tuple[dict, IsolationPlan]:
    has_profile, has_layout = "mig_profile" in isolation, "mig_layout" in isolation
    if has_profile and has_layout:
        raise InvalidInput(
            "give either mig_profile (one profile on every GPU) or mig_layout (a per-GPU "
            "layout), not both",
            code="invalid_isolation",
            field="isolation.mig_layout",
        )
    if not has_profile and not has_layout:
        _mig_table(gpu_model)  # a GPU without MIG is told so first
        raise InvalidInput(
            "mode 'mig' needs mig_profile (one MIG profile for every GPU) or mig_layout",
            code="mig_profile_required",
            field="isolation.mig_profile",
        )
    table = _mig_table(gpu_model)
    if has_profile:
        profile, placements = _single(table, isolation["mig_profile"], "isolation.mig_profile")
        plan = IsolationPlan(IsolationMode.MIG.value, "single", placements)
        return {"mode": IsolationMode.MIG.value, "mig_profile": profile}, plan
    placements = _layout(table, isolation["mig_layout"], "isolation.mig_layout")
    plan = IsolationPlan(IsolationMode.MIG.value, "mixed", placements)
    return {"mode": IsolationMode.MIG.value, "mig_layout": plan.mig_devices}, plan


def _counts(raw: Any, field_name: str) -> dict[str, int]:
    if (
        not isinstance(raw, Mapping)
        or not raw
        or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v > 0
            for k, v in raw.items()
        )
    ):
        raise InvalidInput(
            f"{field_name.split('.')[-1]} must be a non-empty object of profile name -> "
            'positive count, e.g. {"3g.47gb": 1, "1g.12gb": 2}',
            code="invalid_isolation",
            field=field_name,
        )
    return dict(raw)


def _layout(table: MigTable, raw: Any, field_name: str) -> tuple[Placement, ...]:
    counts = _counts(raw, field_name)
    canonical: dict[str, int] = {}
    for name, count in counts.items():
        key = _profile_name(table, name, f"{field_name}.{name}")
        canonical[key] = canonical.get(key, 0) + count
    try:
        return tuple(place_layout(canonical, table))
    except LayoutDoesNotFit as exc:
        raise InvalidInput(
            f"this layout does not fit one {table.gpu}: {exc.reason}",
            code="mig_layout_does_not_fit",
            field=field_name,
            extra={"rule": exc.code},
        ) from exc


def _vgpu(gpu_model: GpuModel, isolation: Mapping[str, Any]) -> tuple[dict, IsolationPlan]:
    available = list(VgpuProfile.objects.filter(gpu_model=gpu_model).select_related("mig_profile"))
    if not available:
        raise InvalidInput(
            f"the catalog has no vGPU types for {gpu_model.name}; vGPU is not offered on it",
            code="vgpu_not_supported",
            field="isolation.mode",
        )
    has_profile, has_layout = "vgpu_profile" in isolation, "vgpu_layout" in isolation
    if has_profile == has_layout:
        raise InvalidInput(
            "mode 'vgpu' needs exactly one of vgpu_profile (one type, as many as fit on every "
            "GPU) or vgpu_layout (types and counts per GPU)",
            code="vgpu_profile_required",
            field="isolation.vgpu_profile",
        )
    if has_profile:
        field_name = "isolation.vgpu_profile"
        profile = _vgpu_type(gpu_model, isolation["vgpu_profile"], field_name)
        if profile.mig_backed:
            table = _mig_table(gpu_model)
            count = max_instances_single(profile.mig_profile.name, table)
        else:
            count = profile.max_per_gpu
        wanted = {profile.name: count}
        policy = {"mode": IsolationMode.VGPU.value, "vgpu_profile": profile.name}
    else:
        field_name = "isolation.vgpu_layout"
        wanted = {}
        for name, count in _counts(isolation["vgpu_layout"], field_name).items():
            profile = _vgpu_type(gpu_model, name, f"{field_name}.{name}")
            wanted[profile.name] = wanted.get(profile.name, 0) + count
        policy = {"mode": IsolationMode.VGPU.value, "vgpu_layout": wanted}
    by_name = {p.name: p for p in available}
    types = [by_name[name] for name in wanted]
    backed = {p.mig_backed for p in types}
    if len(backed) > 1:
        raise InvalidInput(
            "a GPU runs either MIG-backed or time-sliced vGPU types, not both at once",
            code="vgpu_mixed_backing",
            field=field_name,
        )
    if backed == {True}:
        table = _mig_table(gpu_model)
        mig_counts = {by_name[n].mig_profile.name: c for n, c in wanted.items()}
        try:
            placements = tuple(place_layout(mig_counts, table))
        except LayoutDoesNotFit as exc:
            raise InvalidInput(
                f"the MIG instances behind these vGPUs do not fit one {table.gpu}: {exc.reason}",
                code="mig_layout_does_not_fit",
                field=field_name,
                extra={"rule": exc.code},
            ) from exc
        plan = IsolationPlan(IsolationMode.VGPU.value, "mixed", placements, None, wanted)
        return policy, plan
    _check_time_sliced(gpu_model, types, wanted, field_name)
    return policy, IsolationPlan(IsolationMode.VGPU.value, vgpu_devices=wanted)


def _vgpu_type(gpu_model: GpuModel, name: Any, field_name: str) -> VgpuProfile:
    try:
        return resolve_vgpu_profile(gpu_model, name if isinstance(name, str) else repr(name))
    except UnknownVgpuProfile as exc:
        raise InvalidInput(
            f"vGPU type {name!r} does not exist on {gpu_model.name}; "
            f"valid types: {', '.join(exc.valid)}",
            code="unknown_vgpu_profile",
            field=field_name,
            extra={"valid_profiles": exc.valid},
        ) from exc


def _check_time_sliced(
    gpu_model: GpuModel, types: list[VgpuProfile], wanted: dict[str, int], field_name: str
) -> None:
    """Equal-size mode: one framebuffer size per GPU, at most ``max_per_gpu``; mixed-size
    mode (where the GPU has it): framebuffers add up to at most the GPU's."""
    sizes = {p.framebuffer_mib for p in types}
    if len(sizes) > 1 and gpu_model.vgpu_mixed_size_mode is not True:
        support = (
            "does not support"
            if gpu_model.vgpu_mixed_size_mode is False
            else "is not known to support"
        )
        raise InvalidInput(
            f"vGPU types of different framebuffer sizes ({', '.join(sorted(wanted))}) on one "
            f"GPU need NVIDIA's mixed-size (heterogeneous) mode, which {gpu_model.name} "
            f"{support}; use one size per GPU",
            code="vgpu_mixed_sizes_not_supported",
            field=field_name,
        )
    capacity = max(
        (p.framebuffer_mib * p.max_per_gpu for p in gpu_model.vgpu_profiles.all() if p.max_per_gpu),
        default=0,
    )
    by_name = {p.name: p for p in types}
    for name, count in wanted.items():
        if count > by_name[name].max_per_gpu:
            raise InvalidInput(
                f"{count} x {name} requested; one {gpu_model.name} holds at most "
                f"{by_name[name].max_per_gpu}",
                code="vgpu_layout_does_not_fit",
                field=field_name,
            )
    total = sum(by_name[n].framebuffer_mib * c for n, c in wanted.items())
    if total > capacity:
        raise InvalidInput(
            f"the vGPUs need {total} MiB of framebuffer; one {gpu_model.name} has {capacity} MiB",
            code="vgpu_layout_does_not_fit",
            field=field_name,
        )


def _sharing(
    gpu_model: GpuModel, mode: IsolationMode, isolation: Mapping[str, Any]
) -> tuple[dict, IsolationPlan]:
    if mode == IsolationMode.MPS and "mig_profile" in isolation:
        raise InvalidInput(
            "MPS cannot run on MIG devices: the device plugin's MPS sharing supports full GPUs "
            "only (NVIDIA/k8s-device-plugin README, 'not supported with MIG enabled'); use "
            "time-slicing for MIG devices, or mps without mig_profile",
            code="mps_on_mig_not_supported",
            field="isolation.mig_profile",
        )
    low, high = MPS_REPLICAS if mode == IsolationMode.MPS else TIME_SLICING_REPLICAS
    replicas = isolation.get("replicas")
    if not isinstance(replicas, int) or isinstance(replicas, bool) or not low <= replicas <= high:
        raise InvalidInput(
            f"{mode.value} needs replicas (processes sharing each GPU) from {low} to {high}",
            code="invalid_replicas",
            field="isolation.replicas",
            extra={"min_replicas": low, "max_replicas": high},
        )
    policy: dict[str, Any] = {"mode": mode.value, "replicas": replicas}
    if "mig_profile" in isolation:
        table = _mig_table(gpu_model)
        profile, placements = _single(table, isolation["mig_profile"], "isolation.mig_profile")
        policy["mig_profile"] = profile
        return policy, IsolationPlan(mode.value, "single", placements, (mode.value, replicas))
    return policy, IsolationPlan(mode.value, sharing=(mode.value, replicas))
