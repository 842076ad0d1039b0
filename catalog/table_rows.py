"""Normalise ``kubernetes_versions.yaml``, ``drivers.yaml`` and ``xid.yaml`` into plain rows.

Like :mod:`catalog.gpu_rows`, nothing here touches the database. Row dicts use the model's
field names (``KubernetesVersion``, ``GpuArchitecture``, ``DriverBranch``,
``CudaDriverRequirement``, ``XidCode``) and keep their sources.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from typing import Any

from .datafiles import (
    CatalogDataError,
    fact,
    first_version,
    is_unknown,
    parse_date,
    version_tuple,
)

_MINOR_RE = re.compile(r"^\d+\.\d+$")
_CUDA_LABEL_RE = re.compile(r"^(\d+)\.(\d+)(?:\.\d+)?(?:\s+(GA|RC|Update\s+(\d+)))?$")
_BRANCH_RE = re.compile(r"^R(\d+)$")
_SEVERITIES = ("info", "warning", "critical")
KUBERNETES_SOURCE_MAX = 300


def kubernetes_versions(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``releases`` -> ``{version, released, end_of_life, source}`` rows (dates parsed)."""
    rows = []
    for raw in doc.get("releases") or []:
        version = str(raw.get("version", "")).strip()
        where = f"kubernetes release {version or '?'}"
        if not _MINOR_RE.match(version):
            raise CatalogDataError(where, "version must be a minor version like '1.34'")
        released = parse_date(raw.get("released"), where)
        end_of_life = parse_date(raw.get("end_of_life"), where)
        source = str(raw.get("source", "")).strip()
        if end_of_life < released:
            raise CatalogDataError(where, "end_of_life is before released")
        if not source or len(source) > KUBERNETES_SOURCE_MAX:
            raise CatalogDataError(where, f"source must be 1..{KUBERNETES_SOURCE_MAX} characters")
        rows.append(
            {"version": version, "released": released, "end_of_life": end_of_life, "source": source}
        )
    return rows


def architectures(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """drivers.yaml ``architectures.items`` -> ``GpuArchitecture`` rows.

    ``min_driver`` is the first version in ``min_driver_derived`` (``">= 570.26 (CUDA 12.8
    GA) => R570+"`` -> ``570.26``); ``last_driver`` ``ongoing`` becomes blank.
    """
    section = doc.get("architectures") or {}
    source = section.get("source")
    rows = []
    for item in section.get("items") or []:
        name = str(item.get("arch", "")).strip().lower()
        if not name:
            raise CatalogDataError("architectures", f"an item without 'arch': {item!r}")
        last = str(item.get("last_driver", "")).strip()
        derived = item.get("min_driver_derived")
        rows.append(
            {
                "name": name,
                "compute_capabilities": [str(cc) for cc in item.get("cc") or []],
                "first_cuda": str(item.get("first_cuda", "")),
                "min_driver": first_version(derived) if isinstance(derived, str) else "",
                "last_driver_branch": last if _BRANCH_RE.match(last) else "",
                "sources": [
                    fact("architecture", value=item, source=source),
                    fact("min_driver", value=section.get("derived_note")),
                ],
            }
        )
    return rows


def branch_supports(branch_number: int, arch: Mapping[str, Any]) -> bool:
    """Whether driver branch R<number> supports an architecture row.

    From the first branch whose number reaches the architecture's minimum driver (major
    number) to its last supporting branch (if any). No minimum known: supported.
    """
    if arch["min_driver"] and version_tuple(arch["min_driver"])[0] > branch_number:
        return False
    last = _BRANCH_RE.match(arch["last_driver_branch"] or "")
    return not (last and int(last.group(1)) < branch_number)


def driver_branches(doc: Mapping[str, Any], archs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """drivers.yaml ``branches`` -> ``DriverBranch`` rows with derived ``architectures``."""
    rows = []
    for raw in doc.get("branches") or []:
        branch = str(raw.get("branch", "")).strip()
        match = _BRANCH_RE.match(branch)
        if match is None:
            raise CatalogDataError("branches", f"branch must look like 'R580': {raw!r}")
        number = int(match.group(1))
        designation = str(raw.get("designation", "")).split(" ")[0]
        eol = raw.get("end_of_life")
        eol_text = (
            " / ".join(eol) if isinstance(eol, list) else ("" if is_unknown(eol) else str(eol))
        )
        rows.append(
            {
                "branch": branch,
                "number": number,
                "designation": designation if designation in ("LTSB", "PB", "NFB") else "",
                "end_of_life": eol_text,
                "max_cuda": str(raw.get("max_cuda_without_fwd_compat", "") or ""),
                "architectures": [a["name"] for a in archs if branch_supports(number, a)],
                "notes": str(raw.get("notes", "") or ""),
                "sources": [
                    fact(
                        "branch",
                        value={k: raw[k] for k in ("designation", "end_of_life") if k in raw},
                        source=raw.get("source"),
                    ),
                    fact("architectures", value="derived from drivers.yaml architectures"),
                ],
            }
        )
    return rows


def cuda_requirements(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """drivers.yaml ``cuda_toolkit_min_driver`` -> ``CudaDriverRequirement`` rows.

    Labels are kept as printed (``"11.0.3 Update 1"``, ``"12.4 GA"``); RC rows are skipped.
    ``family_min_driver`` comes from ``cuda_minor_version_compatibility`` (12.x -> 525).
    """
    table = doc.get("cuda_toolkit_min_driver") or {}
    compat = doc.get("cuda_minor_version_compatibility") or {}
    family = {
        str(item.get("cuda", "")).split(".")[0]: first_version(str(item.get("min_driver", "")))
        or str(item.get("min_driver", "")).lstrip(">= ").strip()
        for item in compat.get("items") or []
    }
    windows = table.get("windows_x86_64") or {}
    rows = []
    for label, requirement in (table.get("linux_x86_64") or {}).items():
        match = _CUDA_LABEL_RE.match(str(label))
        if match is None:
            raise CatalogDataError("cuda_toolkit_min_driver", f"cannot parse label {label!r}")
        if match.group(3) == "RC":
            continue
        major, minor, update = match.group(1), match.group(2), match.group(4)
        win = windows.get(label)
        rows.append(
            {
                "label": str(label),
                "cuda_version": f"{major}.{minor}",
                "update": int(update) if update else 0,
                "min_linux_driver": first_version(str(requirement)),
                "min_windows_driver": first_version(str(win)) if win else "",
                "family_min_driver": family.get(major, ""),
                "sources": [
                    fact("min_linux_driver", value=requirement, source=table.get("source")),
                    fact("family_min_driver", value=family.get(major), source=compat.get("source")),
                ],
            }
        )
    return rows


def xid_codes(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """xid.yaml ``xids`` -> ``XidCode`` rows; a ``"144-150"`` range becomes one row per code.

    Severity: the entry's own ``severity`` when it starts with info/warning/critical (the full
    text kept in ``severity_note``), else the ``resolution_buckets_to_nvke`` mapping of the
    immediate action, else critical. ``operator_action`` likewise falls back to the bucket.
    """
    buckets = doc.get("resolution_buckets_to_nvke") or {}
    rows = []
    for raw in doc.get("xids") or []:
        codes = _codes(raw.get("code"))
        mnemonics = [m.strip() for m in str(raw.get("mnemonic", "")).split(",")]
        bucket = _bucket(buckets, str(raw.get("nvidia_immediate_action", "")))
        severity_text = str(raw.get("severity", "") or "")
        severity = severity_text.split(" ")[0]
        if severity not in _SEVERITIES:
            severity = bucket.get("severity", "critical")
        for index, code in enumerate(codes):
            mnemonic = mnemonics[index] if len(mnemonics) == len(codes) else raw.get("mnemonic", "")
            rows.append(
                {
                    "code": code,
                    "mnemonic": str(mnemonic or ""),
                    "description": str(raw.get("nvidia_description", "") or ""),
                    "severity": severity,
                    "severity_note": severity_text if severity_text != severity else "",
                    "operator_action": str(
                        raw.get("operator_action") or bucket.get("operator_action", "")
                    ),
                    "nvidia_immediate_action": str(raw.get("nvidia_immediate_action", "") or ""),
                    "nvidia_investigatory_action": str(
                        raw.get("nvidia_investigatory_action", "") or ""
                    ),
                    "device_plugin_marks_unhealthy": raw.get("device_plugin_marks_unhealthy"),
                    "applies_to": raw.get("applies_to") or {},
                    "sources": [
                        fact("xid", value=raw.get("code"), source=raw.get("source")),
                        fact("severity", value=raw.get("severity"), source=buckets.get("source")),
                    ],
                }
            )
    return rows


def _codes(code: Any) -> list[int]:
    if isinstance(code, int) and not isinstance(code, bool):
        return [code]
    match = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", str(code))
    if match is None or int(match.group(1)) > int(match.group(2)):
        raise CatalogDataError("xids", f"code must be an integer or a range 'a-b': {code!r}")
    return list(range(int(match.group(1)), int(match.group(2)) + 1))


def _bucket(buckets: Mapping[str, Any], action: str) -> Mapping[str, Any]:
    """The NVKE mapping of an NVIDIA bucket; keys may be globs (``WORKFLOW_*``)."""
    if action in buckets:
        return buckets[action]
    for pattern, value in buckets.items():
        if "*" in pattern and fnmatch.fnmatchcase(action, pattern):
            return value
    return {}


_VGPU_NAME_RE = re.compile(r"^[A-Z0-9][A-Za-z0-9]*(?:-[A-Za-z0-9]+)+$")
GIB = 1024


def vgpu_profiles(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``vgpu_profiles.yaml`` -> one dict per model: ``{"model": key, "mixed_size_mode":
    bool | None, "profiles": [VgpuProfile field dicts with "mig_profile" as a name]}``.

    A time-sliced type needs ``framebuffer_gb`` (stored as MiB: GB x 1024, the tables' GB
    being GiB of framebuffer) and ``max_per_gpu``; a MIG-backed type names ``mig_profile``.
    """
    models = []
    for raw in doc.get("models") or []:
        key = str(raw.get("model", "")).strip()
        where = f"vgpu_profiles model {key or '?'}"
        if not key:
            raise CatalogDataError(where, "every entry needs 'model'")
        mixed = raw.get("mixed_size_mode")
        if mixed is not None and not isinstance(mixed, bool):
            raise CatalogDataError(where, "mixed_size_mode must be true, false or null")
        profiles = []
        for item in raw.get("profiles") or []:
            name = str(item.get("name", "")).strip()
            pwhere = f"{where} profile {name or '?'}"
            if not _VGPU_NAME_RE.match(name):
                raise CatalogDataError(pwhere, f"not a vGPU type name: {name!r}")
            mig = item.get("mig_profile")
            framebuffer = item.get("framebuffer_gb")
            per_gpu = item.get("max_per_gpu")
            if mig is None and (not isinstance(framebuffer, int) or not isinstance(per_gpu, int)):
                raise CatalogDataError(
                    pwhere, "a time-sliced type needs integer framebuffer_gb and max_per_gpu"
                )
            profiles.append(
                {
                    "name": name,
                    "series": str(item.get("series", "") or ""),
                    "framebuffer_mib": framebuffer * GIB if isinstance(framebuffer, int) else None,
                    "max_per_gpu": per_gpu if isinstance(per_gpu, int) else None,
                    "mig_profile": str(mig) if mig is not None else None,
                    "verified": bool(item.get("verified", False)),
                    "sources": [
                        fact("vgpu_type", value=name, source=item.get("source")),
                        *(
                            [fact("max_per_gpu", value=item["max_per_gpu_note"])]
                            if item.get("max_per_gpu_note")
                            else []
                        ),
                    ],
                }
            )
        models.append(
            {
                "model": key,
                "mixed_size_mode": mixed,
                "mixed_size_mode_source": raw.get("mixed_size_mode_source"),
                "profiles": profiles,
            }
        )
    return models


def driver_rules(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``driver_rules.yaml`` -> ``DriverRule`` field dicts (``model`` as a catalog key).

    The primary ``key`` is derived (``gpu_min_driver:B200``,
    ``mig_profile_min_branch:A30:1g.6gb+me``, ``mig_combination_min_branch:3+4``).
    """
    kinds = ("gpu_min_driver", "mig_profile_min_branch", "mig_combination_min_branch")
    rows = []
    for raw in doc.get("rules") or []:
        kind = raw.get("kind")
        where = f"driver_rules {raw!r}"
        if kind not in kinds:
            raise CatalogDataError(where, f"kind must be one of {', '.join(kinds)}")
        model = str(raw.get("model", "") or "")
        profile = str(raw.get("profile", "") or "")
        slices = sorted(int(s) for s in raw.get("compute_slices") or [])
        min_driver = str(raw.get("min_driver", "") or "")
        min_branch = str(raw.get("min_branch", "") or "")
        if kind == "gpu_min_driver":
            if not model or not min_driver:
                raise CatalogDataError(where, "gpu_min_driver needs model and min_driver")
            version_tuple(min_driver)
            key = f"{kind}:{model}"
        elif kind == "mig_profile_min_branch":
            if not model or not profile or not _BRANCH_RE.match(min_branch):
                raise CatalogDataError(where, "needs model, profile and min_branch like R470")
            key = f"{kind}:{model}:{profile}"
        else:
            if len(slices) < 2 or not _BRANCH_RE.match(min_branch):
                raise CatalogDataError(where, "needs two or more compute_slices and min_branch")
            key = f"{kind}:{'+'.join(map(str, slices))}"
        rows.append(
            {
                "key": key,
                "kind": kind,
                "model": model,
                "mig_profile": profile,
                "compute_slices": slices,
                "min_driver": min_driver,
                "min_branch": min_branch,
                "note": str(raw.get("note", "") or "")[:300],
                "sources": [fact("rule", value=raw.get("note"), source=raw.get("source"))],
            }
        )
    return rows
