"""Reading the catalog's YAML data files; shared helpers of the loaders.

The data lives in ``catalog/data/`` (see its README): ``gpu_models.yaml``, ``drivers.yaml`` and
``xid.yaml`` are unchanged copies of the project's shared catalog; ``kubernetes_versions.yaml``
and ``mig_aliases.yaml`` are NVKE-authored. Rows built from them keep their sources as
``{"field": str, "value": Any, "source": str | list[str] | None}`` dicts (:func:`fact`).
"""

from __future__ import annotations

import re
from datetime import date
from pathlib import Path
from typing import Any

import yaml

DATA_DIR = Path(__file__).resolve().parent / "data"

GPU_MODELS_FILE = "gpu_models.yaml"
DRIVERS_FILE = "drivers.yaml"
XID_FILE = "xid.yaml"
KUBERNETES_VERSIONS_FILE = "kubernetes_versions.yaml"
MIG_ALIASES_FILE = "mig_aliases.yaml"
PRODUCT_NAMES_FILE = "product_names.yaml"
VGPU_PROFILES_FILE = "vgpu_profiles.yaml"
NVKE_GPU_MODELS_FILE = "gpu_models_nvke.yaml"
DRIVER_RULES_FILE = "driver_rules.yaml"
GPU_SYSTEMS_FILE = "gpu_systems.yaml"

#: libyaml's safe loader when PyYAML was built with it (10x faster), else the Python one
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_VERSION_RE = re.compile(r"(\d+(?:\.\d+)+)")


class CatalogDataError(ValueError):
    """A data file breaks the shape the loader understands; ``where`` names the entry."""

    def __init__(self, where: str, problem: str) -> None:
        self.where = where
        self.problem = problem
        super().__init__(f"{where}: {problem}")


def read_yaml(path: Path | str) -> dict[str, Any]:
    """Parse one YAML file (safe loader; anchors/aliases expand). Raises CatalogDataError."""
    path = Path(path)
    try:
        with path.open(encoding="utf-8") as fh:
            doc = yaml.load(fh, Loader=_SafeLoader)  # a safe loader (no arbitrary objects)
    except OSError as exc:
        raise CatalogDataError(str(path), f"cannot read: {exc}") from exc
    except yaml.YAMLError as exc:
        raise CatalogDataError(str(path), f"invalid YAML: {exc}") from exc
    if not isinstance(doc, dict):
        raise CatalogDataError(str(path), "top level must be a mapping")
    return doc


def fact(field: str, *, value: Any = None, source: Any = None) -> dict[str, Any]:
    """One provenance entry of a row's ``sources`` list."""
    return {"field": field, "value": value, "source": source}


def is_unknown(value: Any) -> bool:
    """The shared catalog writes ``unknown`` (possibly with commentary) for "not found"."""
    return value is None or (isinstance(value, str) and value.strip().lower().startswith("unknown"))


def optional_int(value: Any, where: str) -> int | None:
    """An int, or None for a missing / ``unknown`` value; anything else is an error."""
    if is_unknown(value):
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise CatalogDataError(where, f"expected an integer or 'unknown', got {value!r}")
    return value


def required_int(mapping: dict[str, Any], key: str, where: str) -> int:
    """``mapping[key]`` as a non-negative int; missing or non-integer values are errors."""
    value = mapping.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CatalogDataError(where, f"{key} must be a non-negative integer, got {value!r}")
    return value


def parse_date(value: Any, where: str) -> date:
    """An ISO date given as a quoted string (or a YAML date)."""
    if isinstance(value, date):
        return value
    if isinstance(value, str):
        try:
            return date.fromisoformat(value.strip())
        except ValueError:
            pass
    raise CatalogDataError(where, f"expected a YYYY-MM-DD date, got {value!r}")


def first_version(text: str) -> str:
    """The first dotted number in ``text`` (``">= 570.26 (CUDA 12.8 GA)"`` -> ``"570.26"``)."""
    match = _VERSION_RE.search(text)
    return match.group(1) if match else ""


def version_tuple(version: str) -> tuple[int, ...]:
    """``"570.133.20"`` -> ``(570, 133, 20)``; raises ValueError when not dotted digits."""
    parts = version.strip().split(".")
    if not parts or not all(p.isdigit() for p in parts):
        raise ValueError(f"{version!r} is not a dotted version")
    return tuple(int(p) for p in parts)
