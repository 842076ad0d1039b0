"""Normalise ``gpu_models.yaml`` (shared catalog shape) into plain GPU-model / MIG-profile rows.

The shared file is research output, not a schema: ``nvml_name`` is a string or a list with
commentary in parentheses, profiles are written block- or flow-style, A30 profiles say
``memory_slices_of_4``, some models reuse another model's profiles (``profiles_same_as`` /
``profiles_same_names_as``), and placements are ``"{0,2,4}:2"``, ``"unverified {…}:1"``,
``"unknown (…)"`` or missing. The functions here turn that into :class:`GpuModelRow` /
:class:`MigProfileRow` values without touching the database; ``catalog.loader`` writes them.

Facts and where they come from (all in the YAML, with their ``source:`` kept on each row):

* MIG slices per GPU: 7 compute / 8 memory (``conventions``, MIG user guide "concepts"); A30
  4 / 4 (its ``slices`` entry).
* Placements: ``nvidia-smi mig -lgipp`` (``{starts}:size`` on the memory-slice axis). When a
  profile has none, the ``placement_classes`` table (observed on A100-40GB, H100-80GB, H100 NVL;
  ``a30_layout`` for 4-slice GPUs) gives them by (compute slices, memory slices, ``+me``) and
  the profile is marked unverified.
* Aliases: a profile's ``naming_history`` / ``preproduction_name`` fields and
  ``mig_aliases.yaml``; never inferred from the GiB number in a name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .datafiles import CatalogDataError, fact, is_unknown, optional_int, required_int
from .placements import (
    ClassKey,
    PlacementClass,
    check_placements,
    fallback_placements,
    notation,
    parse_placements,
    placement_classes,
)

#: ``1g.10gb``, ``1g.10gb+me``, ``2g.48gb+gfx`` …; not the ``.me`` of mig-parted config names
PROFILE_NAME_RE = re.compile(r"\b\d+g\.\d+gb(?:\+me(?:\.all)?|\+gfx|-me)?(?!\w|\.\w)")
_PAREN_RE = re.compile(r"\([^()]*\)")
_SLUG_RE = re.compile(r"[^a-z0-9]+")
_NOTE_KEYS = (
    "placements_status",
    "note",
    "memory_total_note",
    "pci_id_disagreement",
    "profile_naming_caveat",
    "production_vs_preproduction",
    "capacity_note",
    "also_covers",
    "media_note",
    "per_profile_gib",
    "per_profile_sm_count",
)

_RELATION_SOURCE_KEYS = {
    "profiles_same_as": "profiles_same_as_source",
    "profiles_same_names_as": "profiles_same_names_source",
}


@dataclass
class MigProfileRow:
    """A MIG profile ready for ``MigProfile`` (field names match the model)."""

    name: str
    compute_slices: int
    memory_slices: int
    max_instances: int
    placement_starts: list[int]
    placement_size: int | None
    placements_verified: bool
    aliases: list[str] = field(default_factory=list)
    nvml_profile: str = ""
    nvidia_smi_id: int | None = None
    memory_mib: int | None = None
    sources: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class GpuModelRow:
    """A GPU model ready for ``GpuModel`` plus its profiles (field names match the model)."""

    slug: str
    name: str
    product_names: list[str]
    architecture: str
    compute_capability: str
    pci_device_id: str
    memory_mib: int | None
    mig_capable: bool
    mig_compute_slices: int | None
    mig_memory_slices: int | None
    max_mig_instances: int | None
    placements_verified: bool
    profiles: list[MigProfileRow] = field(default_factory=list)
    sources: list[dict[str, Any]] = field(default_factory=list)


def slug_for_key(key: str) -> str:
    """Catalog slug: the key lower-cased, runs of other characters as ``-``.

    ``A100-SXM4-80GB`` -> ``a100-sxm4-80gb``, ``H100-PCIe-80GB`` -> ``h100-pcie-80gb``.
    """
    slug = _SLUG_RE.sub("-", key.strip().lower()).strip("-")
    if not slug:
        raise CatalogDataError(f"model {key!r}", "key gives an empty slug")
    return slug


def product_names(raw: Any) -> list[str]:
    """NVML product names from ``nvml_name`` (a string or a list).

    Parenthetical commentary is dropped (``"A100-SXM4-40GB (driver 450.x era)"`` ->
    ``"A100-SXM4-40GB"``), whitespace is collapsed and ``unknown`` is ignored.
    """
    values = raw if isinstance(raw, list) else [raw]
    names: list[str] = []
    for value in values:
        if not isinstance(value, str):
            continue
        text, previous = value, None
        while text != previous:  # innermost parentheses first, for nested commentary
            previous, text = text, _PAREN_RE.sub(" ", text)
        text = " ".join(text.split())
        if text and not is_unknown(text) and text not in names:
            names.append(text)
    return names


def profile_memory_mib(observations: Any) -> tuple[int | None, dict[str, Any] | None]:
    """Usable memory of one instance, in MiB, and the observation it came from.

    Preference: a MiB value from a real capture (MIG device total / GFD label), then
    ``-lgip`` GiB x 1024 (approximate: -lgip prints MiB/1024 to 2 decimals), never a value
    from a mock fixture (the shared README: mocks contain provably wrong values).
    """
    items = (
        [o for o in observations if isinstance(o, dict)] if isinstance(observations, list) else []
    )
    real = [o for o in items if not _is_mock(o)]
    for obs in real:
        if isinstance(obs.get("mib"), int):
            return obs["mib"], obs
    for obs in real:
        if isinstance(obs.get("gib_lgip"), int | float):
            return round(obs["gib_lgip"] * 1024), obs
    return None, None


def _is_mock(observation: Mapping[str, Any]) -> bool:
    text = f"{observation.get('kind', '')} {observation.get('where', '')}"
    return "mock" in text.lower()


def gpu_memory_mib(raw: Any) -> tuple[int | None, dict[str, Any] | None]:
    """The NVML total: the first numeric ``memory_total_mib`` value that is not a mock."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw, {"value": raw}
    if isinstance(raw, list):
        for obs in raw:
            if isinstance(obs, dict) and isinstance(obs.get("value"), int) and not _is_mock(obs):
                return obs["value"], obs
    return None, None


def history_aliases(profile: Mapping[str, Any], name: str) -> list[str]:
    """Other names of the profile recorded in ``naming_history`` / ``preproduction_name``.

    ``"3g.39gb on 535.x/545.x (issue #31)"`` -> ``["3g.39gb"]``.
    """
    found: list[str] = []
    history = profile.get("naming_history")
    texts = history if isinstance(history, list) else [history]
    for text in texts:
        if isinstance(text, str):
            found += PROFILE_NAME_RE.findall(text)
    pre = profile.get("preproduction_name")
    if isinstance(pre, dict) and isinstance(pre.get("name"), str):
        found.append(pre["name"].strip())
    return [alias for i, alias in enumerate(found) if alias != name and alias not in found[:i]]


@dataclass(frozen=True)
class ModelContext:
    """What a profile needs from its model and the document conventions."""

    key: str
    memory_slices_per_gpu: int
    observed: bool
    placements_source: Any
    classes: Mapping[ClassKey, PlacementClass]
    profiles_source: Any = None


def normalise_profile(raw: Mapping[str, Any], ctx: ModelContext) -> MigProfileRow:
    """One profile (block or flow style; A30's ``memory_slices_of_4``) as a row."""
    name = str(raw.get("name", "")).strip()
    where = f"{ctx.key} profile {name or '?'}"
    if not PROFILE_NAME_RE.fullmatch(name):
        raise CatalogDataError(where, f"not a MIG profile name: {name!r}")
    compute = required_int(raw, "compute_slices", where)
    memory_key = "memory_slices" if "memory_slices" in raw else "memory_slices_of_4"
    memory = required_int(raw, memory_key, where)
    media = name.endswith("+me")
    profile_source = raw.get("source") or ctx.profiles_source
    sources = [fact("profile", value=name, source=profile_source)]
    placements = parse_placements(raw.get("placements"), where)
    if placements is not None:
        verified = placements.verified and ctx.observed
        sources.append(
            fact(
                "placements",
                value=raw["placements"],
                source=ctx.placements_source or profile_source,
            )
        )
    else:
        klass = fallback_placements(ctx.classes, compute, memory, media)
        if klass is None:
            raise CatalogDataError(where, "no placements and no placement class to fall back to")
        placements, verified = klass.placements, False
        sources.append(
            fact(
                "placements",
                value=f"placement_classes[{klass.label!r}] {notation(placements)} "
                f"(profile gives {raw.get('placements', 'none')!r})",
                source=klass.source,
            )
        )
    check_placements(placements, memory, ctx.memory_slices_per_gpu, where)
    memory_mib, observation = profile_memory_mib(raw.get("memory"))
    if observation is not None:
        sources.append(
            fact(
                "memory_mib", value=observation, source=observation.get("source") or profile_source
            )
        )
    if isinstance(raw.get("memory"), list) and len(raw["memory"]) > 1:
        sources.append(fact("memory_observations", value=raw["memory"], source=profile_source))
    aliases = history_aliases(raw, name)
    if aliases:
        history = raw.get("naming_history") or raw.get("preproduction_name")
        sources.append(fact("aliases", value=history, source=_alias_source(raw)))
    nvml_profile = raw.get("nvml_profile")
    return MigProfileRow(
        name=name,
        compute_slices=compute,
        memory_slices=memory,
        max_instances=required_int(raw, "max_instances", where),
        placement_starts=list(placements.starts),
        placement_size=placements.size,
        placements_verified=verified,
        aliases=aliases,
        nvml_profile=nvml_profile if isinstance(nvml_profile, str) else "",
        nvidia_smi_id=optional_int(raw.get("nvidia_smi_id"), where),
        memory_mib=memory_mib,
        sources=sources,
    )


def _alias_source(raw: Mapping[str, Any]) -> Any:
    pre = raw.get("preproduction_name")
    if isinstance(pre, dict) and pre.get("source"):
        return pre["source"]
    return raw.get("source")


def copied_profiles(
    source: GpuModelRow, *, relation: str, relation_source: Any
) -> list[MigProfileRow]:
    """Profiles of a model declared ``profiles_same_as`` / ``profiles_same_names_as`` another.

    Names, slices, instance counts and placements are copied; placements become unverified
    (no capture of this SKU), and per-SKU measurements (nvidia-smi ID, memory, aliases) are
    not copied: the shared catalog warns they "must NOT be assumed" for the other SKU.
    """
    rows = []
    for p in source.profiles:
        rows.append(
            MigProfileRow(
                name=p.name,
                compute_slices=p.compute_slices,
                memory_slices=p.memory_slices,
                max_instances=p.max_instances,
                placement_starts=list(p.placement_starts),
                placement_size=p.placement_size,
                placements_verified=False,
                nvml_profile=p.nvml_profile,
                sources=[
                    fact("profile", value=f"{relation}: {source.name}", source=relation_source)
                ],
            )
        )
    return rows


def conventions(doc: Mapping[str, Any], defaults: Mapping[str, Any] | None) -> tuple[int, int]:
    """(compute, memory) slices per MIG GPU from ``conventions`` (7 / 8 in the shared file)."""
    conv = doc.get("conventions") or (defaults or {}).get("conventions") or {}
    return (
        required_int(conv, "sm_slices_per_gpu", "conventions"),
        required_int(conv, "memory_slices_per_gpu", "conventions"),
    )


def normalise_models(
    doc: Mapping[str, Any],
    *,
    defaults: Mapping[str, Any] | None = None,
    known: Mapping[str, GpuModelRow] | None = None,
) -> list[GpuModelRow]:
    """All ``models`` of a gpu_models-shaped document, in file order.

    ``defaults`` is the main document (conventions and placement classes for an ``--extra``
    file that has none); ``known`` maps catalog keys already normalised, so an extra model may
    say ``profiles_same_as: H100-SXM5-80GB``.
    """
    models = doc.get("models")
    if not isinstance(models, list):
        raise CatalogDataError("models", "a gpu_models file needs a 'models' list")
    per_gpu = conventions(doc, defaults)
    classes = placement_classes(doc) if doc.get("placement_classes") else {}
    if not classes and defaults:
        classes = placement_classes(defaults)
    rows: dict[str, GpuModelRow] = {}
    pending: list[tuple[int, Mapping[str, Any]]] = []
    order: list[str] = []
    for raw in models:
        key = raw.get("key") if isinstance(raw, dict) else None
        if not isinstance(key, str) or not key.strip():
            raise CatalogDataError("models", f"every model needs a 'key': {raw!r}")
        if key in order:
            raise CatalogDataError(f"model {key}", "key appears twice")
        order.append(key)
        if raw.get("profiles_same_as") or raw.get("profiles_same_names_as"):
            pending.append((len(order) - 1, raw))
        else:
            rows[key] = _model_row(raw, per_gpu, classes, None)
    lookup = {**(known or {}), **rows}
    for _, raw in pending:
        rows[raw["key"]] = _model_row(raw, per_gpu, classes, lookup)
        lookup[raw["key"]] = rows[raw["key"]]
    return [rows[key] for key in order]


def _model_row(
    raw: Mapping[str, Any],
    per_gpu: tuple[int, int],
    classes: Mapping[int, Mapping[ClassKey, PlacementClass]],
    lookup: Mapping[str, GpuModelRow] | None,
) -> GpuModelRow:
    key = raw["key"].strip()
    where = f"model {key}"
    mig = bool(raw.get("mig_capable", False))
    compute_per_gpu = memory_per_gpu = max_instances = None
    profiles: list[MigProfileRow] = []
    observed = raw.get("placements_status") == "observed"
    if mig:
        slices = raw.get("slices") or {}
        compute_per_gpu = slices.get("compute", per_gpu[0])
        memory_per_gpu = slices.get("memory", per_gpu[1])
        max_instances = optional_int(raw.get("max_mig_instances"), where)
        ctx = ModelContext(
            key=key,
            memory_slices_per_gpu=memory_per_gpu,
            observed=observed,
            placements_source=raw.get("placements_source"),
            classes=classes.get(memory_per_gpu, {}),
            profiles_source=raw.get("profiles_source"),
        )
        profiles = _profiles(raw, ctx, lookup)
        if not profiles:
            raise CatalogDataError(where, "a MIG-capable model needs profiles")
    elif raw.get("profiles"):
        raise CatalogDataError(where, "profiles given for a model that is not MIG-capable")
    names = [p.name for p in profiles]
    if len(names) != len(set(names)):
        raise CatalogDataError(where, "duplicate profile names")
    memory_mib, memory_obs = gpu_memory_mib(raw.get("memory_total_mib"))
    return GpuModelRow(
        slug=slug_for_key(key),
        name=key,
        product_names=product_names(raw.get("nvml_name")),
        architecture=_text(raw.get("architecture")).lower(),
        compute_capability=_text(raw.get("compute_capability")),
        pci_device_id=_text(raw.get("pci_device_id")),
        memory_mib=memory_mib,
        mig_capable=mig,
        mig_compute_slices=compute_per_gpu,
        mig_memory_slices=memory_per_gpu,
        max_mig_instances=max_instances,
        placements_verified=mig and observed and all(p.placements_verified for p in profiles),
        profiles=profiles,
        sources=_model_sources(raw, memory_obs),
    )


def _profiles(
    raw: Mapping[str, Any], ctx: ModelContext, lookup: Mapping[str, GpuModelRow] | None
) -> list[MigProfileRow]:
    for relation in ("profiles_same_as", "profiles_same_names_as"):
        other = raw.get(relation)
        if other:
            if lookup is None or other not in lookup:
                raise CatalogDataError(f"model {ctx.key}", f"{relation}: unknown model {other!r}")
            relation_source = raw.get(_RELATION_SOURCE_KEYS[relation])
            return copied_profiles(
                lookup[other], relation=relation, relation_source=relation_source
            )
    profiles = raw.get("profiles") or []
    if not isinstance(profiles, list):
        raise CatalogDataError(f"model {ctx.key}", "profiles must be a list")
    return [normalise_profile(p, ctx) for p in profiles]


def _text(value: Any) -> str:
    return (
        "" if is_unknown(value) or not isinstance(value, str | int | float) else str(value).strip()
    )


def _model_sources(
    raw: Mapping[str, Any], memory_obs: dict[str, Any] | None
) -> list[dict[str, Any]]:
    sources = [fact("nvml_name", value=raw.get("nvml_name"), source=raw.get("nvml_name_source"))]
    if memory_obs is not None:
        sources.append(fact("memory_mib", value=memory_obs, source=memory_obs.get("source")))
    elif raw.get("memory_total_mib") is not None:
        sources.append(fact("memory_total_mib", value=raw.get("memory_total_mib")))
    for key, value in raw.items():
        if key.endswith("_source") and key != "nvml_name_source":
            sources.append(
                fact(
                    key.removesuffix("_source"),
                    value=raw.get(key.removesuffix("_source")),
                    source=value,
                )
            )
        elif key == "source":
            sources.append(fact("model", source=value))
        elif key in _NOTE_KEYS:
            sources.append(fact(key, value=value))
    return sources


def apply_extra_aliases(rows: Iterable[GpuModelRow], doc: Mapping[str, Any]) -> int:
    """Add ``mig_aliases.yaml`` entries to the rows; returns how many were added."""
    by_key = {row.name: row for row in rows}
    added = 0
    for entry in doc.get("aliases") or []:
        where = f"mig_aliases {entry!r}"
        row = by_key.get(entry.get("model"))
        if row is None:
            raise CatalogDataError(where, "unknown model")
        profile = next((p for p in row.profiles if p.name == entry.get("profile")), None)
        alias = str(entry.get("alias", "")).strip()
        if profile is None or not PROFILE_NAME_RE.fullmatch(alias):
            raise CatalogDataError(where, "unknown profile or malformed alias")
        if any(p.name == alias for p in row.profiles):
            raise CatalogDataError(where, "alias is the name of another profile")
        if alias not in profile.aliases:
            profile.aliases.append(alias)
            profile.sources.append(fact("aliases", value=alias, source=entry.get("source")))
            added += 1
    return added


def apply_extra_product_names(rows: Iterable[GpuModelRow], doc: Mapping[str, Any]) -> int:
    """Add ``product_names.yaml`` entries (``{model, name, source}``) to the rows' NVML product
    names, each recorded as a sourced fact; returns how many were added. CatalogDataError for
    an unknown model or an entry without a name or source."""
    by_key = {row.name: row for row in rows}
    added = 0
    for entry in doc.get("names") or []:
        where = f"product_names {entry!r}"
        row = by_key.get(entry.get("model"))
        if row is None:
            raise CatalogDataError(where, "unknown model")
        names = product_names(entry.get("name"))
        if len(names) != 1 or not entry.get("source"):
            raise CatalogDataError(where, "an entry needs one product name and its source")
        if names[0] not in row.product_names:
            row.product_names.append(names[0])
            row.sources.append(fact("product_names", value=names[0], source=entry["source"]))
            added += 1
    return added
