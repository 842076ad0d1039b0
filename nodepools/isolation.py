"""Validation of a node pool's isolation policy against the GPU catalog.

Shapes (DESIGN §10): ``{"mode": "exclusive"}``, ``{"mode": "mig", "mig_profile": "1g.20gb"}``
(one profile on every GPU: the GPU Operator's "single" strategy). Every refusal is an
:class:`~nvke.errors.InvalidInput` naming the field, with a stable code.
"""

from __future__ import annotations

from typing import Any

from catalog.models import GpuModel
from catalog.services import MigNotSupported, UnknownMigProfile, resolve_mig_profile
from nvke.errors import InvalidInput

from .choices import IsolationMode

AVAILABLE_MODES = (IsolationMode.EXCLUSIVE, IsolationMode.MIG)


def validate_isolation(gpu_model: GpuModel, isolation: Any) -> dict[str, Any]:
    """Return the normalised policy (MIG profile aliases resolved to the catalog name).

    Raises InvalidInput with codes ``invalid_isolation``, ``isolation_mode_not_available``,
    ``mig_not_supported``, ``mig_profile_required``, ``unknown_mig_profile``.
    """
    if not isinstance(isolation, dict) or not isinstance(isolation.get("mode"), str):
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
    if mode not in AVAILABLE_MODES:
        raise InvalidInput(
            f"isolation mode {mode!r} is not offered by this NVKE release; "
            f"available: {', '.join(AVAILABLE_MODES)}",
            code="isolation_mode_not_available",
            field="isolation.mode",
        )
    if mode == IsolationMode.EXCLUSIVE:
        _no_extra_keys(isolation, {"mode"})
        return {"mode": mode}
    return _validate_mig(gpu_model, isolation)


def _validate_mig(gpu_model: GpuModel, isolation: dict[str, Any]) -> dict[str, Any]:
    _no_extra_keys(isolation, {"mode", "mig_profile"})
    name = isolation.get("mig_profile")
    if not gpu_model.mig_capable:
        raise InvalidInput(
            f"{gpu_model.name} does not support MIG (MIG support is a per-product fact: "
            "NVIDIA MIG user guide, supported GPUs); use mode 'exclusive'",
            code="mig_not_supported",
            field="isolation.mode",
        )
    if not isinstance(name, str) or not name:
        raise InvalidInput(
            "mode 'mig' needs mig_profile (one MIG profile for every GPU)",
            code="mig_profile_required",
            field="isolation.mig_profile",
        )
    try:
        profile = resolve_mig_profile(gpu_model, name)
    except MigNotSupported as exc:  # pragma: no cover - mig_capable checked above
        raise InvalidInput(str(exc), code="mig_not_supported", field="isolation.mode") from exc
    except UnknownMigProfile as exc:
        raise InvalidInput(
            f"MIG profile {name!r} does not exist on {gpu_model.name}; "
            f"valid profiles: {', '.join(exc.valid)}",
            code="unknown_mig_profile",
            field="isolation.mig_profile",
            extra={"valid_profiles": list(exc.valid)},
        ) from exc
    return {"mode": IsolationMode.MIG.value, "mig_profile": profile.name}


def _no_extra_keys(isolation: dict[str, Any], allowed: set[str]) -> None:
    extra = sorted(set(isolation) - allowed)
    if extra:
        raise InvalidInput(
            f"unexpected isolation field(s) for mode {isolation['mode']!r}: {', '.join(extra)}",
            code="invalid_isolation",
            field=f"isolation.{extra[0]}",
        )
