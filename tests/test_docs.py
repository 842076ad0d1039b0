"""The docs site (MkDocs, docs/): it builds with --strict (no broken link or anchor, no page
left out of the navigation), its generated references list what the code declares, and the
README stays a short front page whose tour is the docs' tour."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

from nvke.beat_schedule import PERIODIC_TASKS
from nvke.settings_registry import SETTINGS
from tests.docs_blocks import BLOCKS, ROOT, bash_block, marked_block


def load_hooks():
    spec = importlib.util.spec_from_file_location("nvke_docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_site_builds_strict(tmp_path):
    site = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    page = (site / "reference" / "configuration" / "index.html").read_text()
    missing = [s.name for s in SETTINGS if s.name not in page]
    assert missing == []
    assert "NVKE_STATE_DIR" in page  # the agent's options, from its own parser
    tasks = (site / "reference" / "periodic-tasks" / "index.html").read_text()
    assert [p.task for p in PERIODIC_TASKS if p.task not in tasks] == []


def test_a_page_left_out_of_the_navigation_fails_the_build(tmp_path):
    orphan = ROOT / "docs" / "development" / "zz-orphan-test-page.md"
    orphan.write_text("# orphan\n")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "s")],
            cwd=ROOT,
            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
            capture_output=True,
            text=True,
            timeout=240,
        )
    finally:
        orphan.unlink()
    assert proc.returncode != 0
    assert "development/zz-orphan-test-page.md" in proc.stderr


def test_the_configuration_reference_shows_each_setting_with_its_default_and_unit():
    page = load_hooks().render_configuration()
    rows = {line.split("|")[1].strip(" `"): line for line in page.splitlines() if "| `" in line}
    assert (
        "| `NVKE_RESYNC_INTERVAL_S` | float | `15.0` | s | operator |"
        in rows["NVKE_RESYNC_INTERVAL_S"]
    )
    assert (
        "| `NVKE_WEBHOOK_ALLOWED_NETWORKS` | list | (empty) |"
        in rows["NVKE_WEBHOOK_ALLOWED_NETWORKS"]
    )
    assert "`--state-dir`" in rows["NVKE_STATE_DIR"]


def test_the_periodic_tasks_reference_names_the_setting_behind_a_period():
    page = load_hooks().render_periodic_tasks()
    line = next(x for x in page.splitlines() if "`billing.tasks.refresh_usage`" in x)
    assert "`NVKE_BILLING_AGGREGATE_INTERVAL_S` (5 min)" in line
    assert "| 270 s |" in line  # expires at 0.9 of the period


def test_the_readme_is_short_and_its_tour_is_the_docs_tour():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert bash_block("tour", ROOT / "README.md") == bash_block("tour")
    assert "mkdocs serve" in readme


def test_every_executable_block_is_where_the_tests_read_it():
    for name, path in BLOCKS.items():
        assert marked_block(name, path).strip(), f"{path}: {name} is empty"
