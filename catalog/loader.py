"""Load the catalog data files into the database: idempotent update-or-create, one transaction.

``load_catalog()`` reads ``catalog/data/`` (see its README) plus any ``extra`` files shaped like
``gpu_models.yaml`` (operators add GPU models without code), normalises them with
:mod:`catalog.gpu_rows` / :mod:`catalog.table_rows` and writes every row with
``update_or_create``. Running it twice changes nothing the second time. Rows that are no longer
in the data are kept (other apps may reference them) unless ``prune=True``, which deletes the
MIG profiles of loaded models that the data no longer lists.

Raises :class:`~catalog.datafiles.CatalogDataError` on malformed data (nothing is written).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from django.db import transaction

from . import table_rows
from .datafiles import (
    DATA_DIR,
    DRIVER_RULES_FILE,
    DRIVERS_FILE,
    GPU_MODELS_FILE,
    GPU_SYSTEMS_FILE,
    KUBERNETES_VERSIONS_FILE,
    MIG_ALIASES_FILE,
    NVKE_GPU_MODELS_FILE,
    PRODUCT_NAMES_FILE,
    VGPU_PROFILES_FILE,
    XID_FILE,
    CatalogDataError,
    read_yaml,
)
from .gpu_rows import (
    GpuModelRow,
    apply_extra_aliases,
    apply_extra_product_names,
    normalise_models,
    parse_placements,
    product_names,
    slug_for_key,
)
from .models import (
    CudaDriverRequirement,
    DriverBranch,
    DriverRule,
    GpuArchitecture,
    GpuModel,
    GpuSystem,
    KubernetesVersion,
    MigProfile,
    VgpuProfile,
    XidCode,
)

__all__ = [
    "CatalogDataError",
    "LoadResult",
    "gpu_model_rows",
    "load_catalog",
    "parse_placements",
    "product_names",
    "slug_for_key",
]


@dataclass
class LoadResult:
    """Rows in the data per kind (``counts``) and how many of them were newly created."""

    counts: dict[str, int] = field(default_factory=dict)
    created: dict[str, int] = field(default_factory=dict)
    pruned_profiles: list[str] = field(default_factory=list)
    stale_profiles: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def gpu_model_rows(
    data_dir: Path = DATA_DIR, extra: Sequence[Path | str] = ()
) -> list[GpuModelRow]:
    """The normalised GPU models of ``gpu_models.yaml`` + ``mig_aliases.yaml`` +
    ``product_names.yaml`` (NVML names found later) + ``gpu_models_nvke.yaml`` (NVKE-authored
    models) + extras.

    An extra model with the key of a built-in one replaces it. Product names must be unique
    across models (a host's GPU must match one model).
    """
    main = read_yaml(data_dir / GPU_MODELS_FILE)
    rows = {row.name: row for row in normalise_models(main)}
    apply_extra_aliases(rows.values(), read_yaml(data_dir / MIG_ALIASES_FILE))
    apply_extra_product_names(rows.values(), _optional_yaml(data_dir / PRODUCT_NAMES_FILE))
    nvke_models = data_dir / NVKE_GPU_MODELS_FILE
    if nvke_models.exists():
        extra = [nvke_models, *extra]
    for path in extra:
        for row in normalise_models(read_yaml(path), defaults=main, known=rows):
            rows[row.name] = row
    _check_unique([(row.slug, name) for row in rows.values() for name in row.product_names])
    slugs = Counter(row.slug for row in rows.values())
    if any(count > 1 for count in slugs.values()):
        raise CatalogDataError("models", f"keys give the same slug: {sorted(slugs)}")
    return list(rows.values())


def _check_unique(pairs: Iterable[tuple[str, str]]) -> None:
    owner: dict[str, str] = {}
    for slug, name in pairs:
        key = " ".join(name.split()).casefold()
        if owner.setdefault(key, slug) != slug:
            raise CatalogDataError(
                "product_names", f"{name!r} is a product name of both {owner[key]} and {slug}"
            )


def load_catalog(
    *, data_dir: Path | str = DATA_DIR, extra: Sequence[Path | str] = (), prune: bool = False
) -> LoadResult:
    """Write all catalog rows (update-or-create, one transaction); see the module docstring."""
    data_dir = Path(data_dir)
    gpus = gpu_model_rows(data_dir, extra)
    drivers = read_yaml(data_dir / DRIVERS_FILE)
    archs = table_rows.architectures(drivers)
    tables: list[tuple[str, type, str, list[dict[str, Any]]]] = [
        (
            "kubernetes_versions",
            KubernetesVersion,
            "version",
            table_rows.kubernetes_versions(read_yaml(data_dir / KUBERNETES_VERSIONS_FILE)),
        ),
        ("gpu_architectures", GpuArchitecture, "name", archs),
        ("driver_branches", DriverBranch, "branch", table_rows.driver_branches(drivers, archs)),
        (
            "cuda_driver_requirements",
            CudaDriverRequirement,
            "label",
            table_rows.cuda_requirements(drivers),
        ),
        ("xid_codes", XidCode, "code", table_rows.xid_codes(read_yaml(data_dir / XID_FILE))),
    ]
    result = LoadResult()
    with transaction.atomic():
        _write_gpus(gpus, result, prune=prune)
        for kind, model, key, rows in tables:
            created = 0
            for row in rows:
                values = dict(row)
                lookup = {key: values.pop(key)}
                created += model.objects.update_or_create(**lookup, defaults=values)[1]
            result.counts[kind], result.created[kind] = len(rows), created
        _write_vgpu_profiles(
            table_rows.vgpu_profiles(_optional_yaml(data_dir / VGPU_PROFILES_FILE)), result
        )
        _write_driver_rules(
            table_rows.driver_rules(_optional_yaml(data_dir / DRIVER_RULES_FILE)), result
        )
        _write_systems(gpu_system_rows(_optional_yaml(data_dir / GPU_SYSTEMS_FILE)), result)
        _check_unique(_db_product_names())
    return result


def _optional_yaml(path: Path) -> dict[str, Any]:
    """NVKE-authored files may be absent from an operator's own data folder."""
    return read_yaml(path) if path.exists() else {}


def _model_by_key(key: str, where: str) -> GpuModel:
    try:
        return GpuModel.objects.get(slug=slug_for_key(key))
    except GpuModel.DoesNotExist:
        raise CatalogDataError(where, f"unknown GPU model {key!r}") from None


def _write_vgpu_profiles(models: list[dict[str, Any]], result: LoadResult) -> None:
    created = count = 0
    for entry in models:
        where = f"vgpu_profiles model {entry['model']}"
        gpu = _model_by_key(entry["model"], where)
        if gpu.vgpu_mixed_size_mode != entry["mixed_size_mode"]:
            gpu.vgpu_mixed_size_mode = entry["mixed_size_mode"]
            gpu.save(update_fields=["vgpu_mixed_size_mode"])
        for row in entry["profiles"]:
            values = dict(row)
            name = values.pop("name")
            mig_name = values.pop("mig_profile")
            mig = None
            if mig_name is not None:
                mig = MigProfile.objects.filter(gpu_model=gpu, name=mig_name).first()
                if mig is None:
                    raise CatalogDataError(
                        where, f"{name}: {gpu.slug} has no MIG profile {mig_name!r}"
                    )
            values["mig_profile"] = mig
            created += VgpuProfile.objects.update_or_create(
                gpu_model=gpu, name=name, defaults=values
            )[1]
            count += 1
    result.counts["vgpu_profiles"], result.created["vgpu_profiles"] = count, created


def _write_driver_rules(rows: list[dict[str, Any]], result: LoadResult) -> None:
    created = 0
    for row in rows:
        values = dict(row)
        key = values.pop("key")
        model = values.pop("model")
        values["gpu_model"] = _model_by_key(model, f"driver_rules {key}") if model else None
        created += DriverRule.objects.update_or_create(key=key, defaults=values)[1]
    result.counts["driver_rules"], result.created["driver_rules"] = len(rows), created


#: integer fields of a ``gpu_systems.yaml`` entry (required ones first)
_SYSTEM_REQUIRED = ("compute_trays", "gpus_per_tray", "nvlink_domain_gpus")
_SYSTEM_OPTIONAL = ("grace_cpus_per_tray", "nvlink_switch_trays")


def gpu_system_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``systems`` of ``gpu_systems.yaml`` as GpuSystem rows: ``{"slug", "name",
    "gpu_model" (a model key), "compute_trays", "gpus_per_tray", "nvlink_domain_gpus",
    "grace_cpus_per_tray", "nvlink_switch_trays", "sources"}``.

    Raises CatalogDataError for a missing or non-positive count, a domain that is not a
    whole number of trays or larger than the system, or an entry without sources.
    """
    rows = []
    for entry in doc.get("systems") or []:
        key = str(entry.get("key") or "")
        where = f"systems {key or '?'}"
        if not key or not entry.get("gpu_model"):
            raise CatalogDataError(where, "key and gpu_model are required")
        row: dict[str, Any] = {
            "slug": slug_for_key(key),
            "name": str(entry.get("name") or key)[:100],
            "gpu_model": str(entry["gpu_model"]),
        }
        for name in (*_SYSTEM_REQUIRED, *_SYSTEM_OPTIONAL):
            value = entry.get(name)
            if value is None and name in _SYSTEM_OPTIONAL:
                row[name] = None
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise CatalogDataError(where, f"{name} must be a positive integer")
            row[name] = value
        domain, tray = row["nvlink_domain_gpus"], row["gpus_per_tray"]
        if domain % tray or domain > tray * row["compute_trays"]:
            raise CatalogDataError(
                where, "nvlink_domain_gpus must be a whole number of trays of the system"
            )
        sources = entry.get("sources")
        if not isinstance(sources, list) or not sources:
            raise CatalogDataError(where, "every system lists its sources")
        row["sources"] = sources
        rows.append(row)
    return rows


def _write_systems(rows: list[dict[str, Any]], result: LoadResult) -> None:
    created = 0
    for row in rows:
        values = dict(row)
        slug = values.pop("slug")
        values["gpu_model"] = _model_by_key(values["gpu_model"], f"systems {slug}")
        created += GpuSystem.objects.update_or_create(slug=slug, defaults=values)[1]
    result.counts["gpu_systems"], result.created["gpu_systems"] = len(rows), created


def _db_product_names() -> list[tuple[str, str]]:
    """(slug, product name) of every model in the database, admin-added ones included."""
    return [
        (slug, name)
        for slug, names in GpuModel.objects.values_list("slug", "product_names")
        for name in names
    ]


def _write_gpus(rows: list[GpuModelRow], result: LoadResult, *, prune: bool) -> None:
    created_models = created_profiles = profile_count = 0
    for row in rows:
        values = asdict(row)
        profiles = values.pop("profiles")
        slug = values.pop("slug")
        gpu, created = GpuModel.objects.update_or_create(slug=slug, defaults=values)
        created_models += created
        names = []
        for profile in profiles:
            name = profile.pop("name")
            names.append(name)
            created_profiles += MigProfile.objects.update_or_create(
                gpu_model=gpu, name=name, defaults=profile
            )[1]
        profile_count += len(profiles)
        stale = MigProfile.objects.filter(gpu_model=gpu).exclude(name__in=names)
        labels = [f"{slug}/{name}" for name in stale.values_list("name", flat=True)]
        if prune and labels:
            stale.delete()
            result.pruned_profiles += labels
        else:
            result.stale_profiles += labels
    result.counts.update(gpu_models=len(rows), mig_profiles=profile_count)
    result.created.update(gpu_models=created_models, mig_profiles=created_profiles)
