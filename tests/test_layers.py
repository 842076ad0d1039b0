"""The app layering of DESIGN §2 is a contract (import-linter's ``layers``, ``[tool.importlinter]``
in pyproject.toml, run by ``make lint``): the tree keeps it, and one upward import breaks it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APPS = (
    "nvke",
    "catalog",
    "tenants",
    "fleet",
    "reservations",
    "clusters",
    "nodepools",
    "billing",
    "webhooks",
    "portal",
)


def lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def copy_of_the_tree(dest: Path) -> Path:
    """The apps' Python files and pyproject.toml (what the contract reads), nothing else."""
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    for app in APPS:
        shutil.copytree(
            ROOT / app,
            dest / app,
            ignore=lambda d, names: [
                n for n in names if not n.endswith(".py") and not (Path(d) / n).is_dir()
            ],
        )
    return dest


def test_the_tree_keeps_the_layers_contract():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 1 kept, 0 broken." in result.stdout


def test_an_upward_import_breaks_the_contract_and_is_named(tmp_path):
    tree = copy_of_the_tree(tmp_path)
    assert lint_imports(tree).returncode == 0  # the copy keeps it, as the tree does
    (tree / "nvke" / "upward.py").write_text("from fleet.models import Host  # noqa: F401\n")
    result = lint_imports(tree)
    assert result.returncode == 1
    assert "Contracts: 0 kept, 1 broken." in result.stdout
    assert "nvke is not allowed to import fleet" in result.stdout
    assert "nvke.upward -> fleet.models (l.1)" in result.stdout
