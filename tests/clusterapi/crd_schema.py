"""Validate objects against the vendored CRDs' ``openAPIV3Schema`` (with ``jsonschema``).

What the API server would check, as far as a schema can say it:

* the schema of the version the object names (``served`` must be true);
* unknown fields are errors (``additionalProperties: false`` is added to every object schema
  with ``properties`` unless it carries ``x-kubernetes-preserve-unknown-fields``), as with
  ``kubectl apply --validate=strict`` / ``fieldValidation=Strict``; the API server would
  otherwise prune them silently, which hides typos;
* ``x-kubernetes-int-or-string`` becomes "integer or string"; other ``x-kubernetes-*``
  keywords are ignored by jsonschema;
* CEL rules (``x-kubernetes-validations``) are not evaluated by jsonschema; the two that
  concern what NVKE renders are checked by hand below (kubeletExtraArgs names unique; a
  default NVIDIADriver has no nodeSelector). The immutability rules (``self == oldSelf``) need
  the stored object and are not checked;
* ``metadata``: name a DNS-1123 subdomain (<= 253), label keys qualified names and values
  <= 63 characters, annotation keys qualified names.
"""

from __future__ import annotations

import copy
import functools
import re
from pathlib import Path
from typing import Any

import jsonschema
import yaml

PROVIDERS = Path(__file__).resolve().parents[2] / "clusters" / "providers"
#: Cluster API's CRDs, and the GPU add-ons' both providers share
CRD_DIRS = (PROVIDERS / "clusterapi" / "crds", PROVIDERS / "crds")

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
QUALIFIED = re.compile(
    rf"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{_NAME}$"
)
LABEL_VALUE = re.compile(rf"^({_NAME})?$")
SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class SchemaError(AssertionError):
    pass


def _strict(schema: Any) -> Any:
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) if k != "properties" else v for k, v in schema.items()}
    if "properties" in schema:
        out["properties"] = {k: _strict(v) for k, v in schema["properties"].items()}
        if "additionalProperties" not in schema and not schema.get(
            "x-kubernetes-preserve-unknown-fields"
        ):
            out["additionalProperties"] = False
    if schema.get("x-kubernetes-int-or-string") and "type" not in schema:
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    return out


@functools.cache
def definitions() -> tuple[dict[str, Any], ...]:
    """The vendored CRDs, parsed (libyaml when available: they are 1.3 MB)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    paths = sorted(p for folder in CRD_DIRS for p in folder.glob("*.yaml"))
    return tuple(yaml.load(path.read_text(), Loader=loader) for path in paths)


@functools.cache
def _crds() -> dict[tuple[str, str], dict[str, Any]]:
    found = {}
    for crd in definitions():
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            if version.get("served"):
                found[(f"{group}/{version['name']}", kind)] = version["schema"]["openAPIV3Schema"]
    return found


@functools.cache
def validator(api_version: str, kind: str) -> jsonschema.Draft7Validator:
    schema = _crds().get((api_version, kind))
    if schema is None:
        raise SchemaError(f"no vendored CRD serves {kind} {api_version}")
    return jsonschema.Draft7Validator(_strict(copy.deepcopy(schema)))


def has_crd(obj: dict[str, Any]) -> bool:
    return (obj.get("apiVersion"), obj.get("kind")) in _crds()


def errors(obj: dict[str, Any]) -> list[str]:
    """Every problem with ``obj`` (empty: valid)."""
    out = [
        f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
        for e in validator(obj["apiVersion"], obj["kind"]).iter_errors(obj)
    ]
    meta = obj.get("metadata") or {}
    name = meta.get("name", "")
    if not SUBDOMAIN.match(name) or len(name) > 253:
        out.append(f"metadata.name: {name!r} is not a DNS-1123 subdomain")
    for key, value in (meta.get("labels") or {}).items():
        if not QUALIFIED.match(key):
            out.append(f"metadata.labels: key {key!r} is not a qualified name")
        if not isinstance(value, str) or not LABEL_VALUE.match(value):
            out.append(f"metadata.labels[{key}]: {value!r} is not a label value")
    for key, value in (meta.get("annotations") or {}).items():
        if not QUALIFIED.match(key) or not isinstance(value, str):
            out.append(f"metadata.annotations: {key!r} is not a qualified name with a string")
    out.extend(_cel(obj))
    return out


def _cel(obj: dict[str, Any]) -> list[str]:
    out = []
    spec = obj.get("spec") or {}
    if obj["kind"] == "KubeadmConfigTemplate":
        spec = ((spec.get("template") or {}).get("spec")) or {}
    if obj["kind"] in ("KubeadmConfigTemplate", "KubeadmControlPlane"):
        spec = spec.get("kubeadmConfigSpec", spec)
        for section in ("initConfiguration", "joinConfiguration"):
            args = ((spec.get(section) or {}).get("nodeRegistration") or {}).get(
                "kubeletExtraArgs"
            ) or []
            names = [a.get("name") for a in args]
            if len(names) != len(set(names)):
                out.append(f"{section}.nodeRegistration.kubeletExtraArgs: names must be unique")
    if obj["kind"] == "NVIDIADriver" and spec.get("default") and spec.get("nodeSelector"):
        out.append("spec: default NVIDIADriver must not use nodeSelector")
    return out


def validate(obj: dict[str, Any]) -> None:
    problems = errors(obj)
    if problems:
        raise SchemaError(f"{obj.get('kind')} {obj.get('metadata', {}).get('name')}: {problems}")
