"""One registry of settings (nvke/settings_registry.py) and one beat schedule.

The environment reads are intercepted at run time (tests/env_read_probe.py patches
``os._Environ.__getitem__`` before NVKE is imported, so ``os.environ[...]``, ``.get``,
``os.getenv`` and django-environ's ``Env`` are all seen), not found by grep.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nvke import settings_registry
from nvke.beat_schedule import PERIODIC_TASKS
from nvke.settings_registry import BY_NAME, SECTIONS, SETTINGS, read

ROOT = Path(__file__).resolve().parent.parent
PROBE = Path(__file__).resolve().parent / "env_read_probe.py"
#: the agent's own options (NVKE_SERVER, NVKE_STATE_DIR …) are declared by its parser: the
#: agent is a separate program that imports nothing of NVKE's (docs: configuration reference)
OWN_CODE_DIRS = ("nvke", "catalog", "tenants", "fleet", "reservations", "clusters",
                 "nodepools", "billing", "webhooks", "portal")  # fmt: skip


def agent_option_names() -> set[str]:
    """``NVKE_*`` names the agent's command line reads (one per option, and NVKE_CONFIG)."""
    from nvke_agent.cli import environment_options

    return set(environment_options())


def run_probe(extra: str = "") -> list[dict]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "agent")])}
    proc = subprocess.run(
        [sys.executable, str(PROBE), *([extra] if extra else [])],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    lines = proc.stdout.split("--reads--\n", 1)[1].splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def own_code(path: str) -> bool:
    rel = Path(path).resolve()
    try:
        rel = rel.relative_to(ROOT)
    except ValueError:
        return False
    return rel.parts[0] in OWN_CODE_DIRS or rel.name == "manage.py"


def problems(reads: list[dict], allowed: set[str]) -> list[str]:
    """What breaks the rules: an undeclared NVKE_* name read anywhere, an undeclared name read
    by NVKE's own code, and NVKE's own code reading around the registry."""
    found = []
    for r in reads:
        name, path = r["name"], r["file"]
        if path.endswith("wsgiref/handlers.py"):
            continue  # Django's test client copies the whole environment into each request
        mine = own_code(path)
        if name not in allowed and (name.startswith("NVKE_") or mine):
            found.append(f"{name} read by {path} is not declared in nvke/settings_registry.py")
        elif mine and not r["via_registry"] and name != "DJANGO_SETTINGS_MODULE":
            found.append(f"{path} reads {name} from os.environ: use settings_registry.read")
    return sorted(set(found))


@pytest.fixture(scope="module")
def probe_reads() -> list[dict]:
    return run_probe()


def test_every_environment_variable_nvke_reads_is_declared(probe_reads):
    names = {r["name"] for r in probe_reads}
    # the probe really ran the settings, fleet's settings, billing's schedule and make run's
    assert {"DATABASE_URL", "NVKE_RESYNC_INTERVAL_S", "NVKE_SCRUB_TIMEOUT_S",
            "NVKE_BILLING_INVOICE_INTERVAL_S", "NVKE_DATA_DIR", "PORT",
            "GUNICORN_BIND"} <= names  # fmt: skip
    assert problems(probe_reads, set(BY_NAME) | agent_option_names()) == []


def test_the_probe_catches_a_read_of_an_undeclared_variable():
    reads = run_probe(
        "import os\n"
        "os.environ.get('NVKE_NOT_DECLARED_ANYWHERE')\n"
        "os.getenv('NVKE_ALSO_NOT_DECLARED', '1')\n"
        "import environ; environ.Env().int('NVKE_THIRD_UNDECLARED', default=3)\n"
    )
    found = problems(reads, set(BY_NAME))
    assert [p.split()[0] for p in found if "not declared" in p] == [
        "NVKE_ALSO_NOT_DECLARED",
        "NVKE_NOT_DECLARED_ANYWHERE",
        "NVKE_THIRD_UNDECLARED",
    ]


def test_own_code_reading_around_the_registry_is_caught():
    reads = [{"name": "NVKE_TRACING", "file": str(ROOT / "nvke" / "x.py"), "via_registry": False}]
    assert problems(reads, set(BY_NAME)) == [
        f"{ROOT / 'nvke' / 'x.py'} reads NVKE_TRACING from os.environ: use settings_registry.read"
    ]


def test_each_setting_is_declared_once_with_a_section_and_a_parsable_default():
    names = [s.name for s in SETTINGS]
    assert len(names) == len(set(names))
    for s in SETTINGS:
        assert s.section in SECTIONS, s.name
        assert s.help and s.help.endswith((".", ")")), s.name
        assert s.audience in ("operator", "developer", "tenant"), s.name


def test_read_parses_by_kind_and_falls_back_to_the_default(monkeypatch):
    monkeypatch.setenv("NVKE_RESYNC_INTERVAL_S", "2.5")
    monkeypatch.setenv("NVKE_WEBHOOK_ALLOWED_NETWORKS", "127.0.0.0/8,10.0.0.0/8")
    monkeypatch.setenv("NVKE_LOGIN_LOCKOUT", "no")
    monkeypatch.setenv("NVKE_CLUSTERAPI_MACHINE_SPEC", '{"image": {"url": "x"}}')
    monkeypatch.setenv("NVKE_MAX_DELETE_ATTEMPTS", "")
    assert read("NVKE_RESYNC_INTERVAL_S") == 2.5
    assert read("NVKE_WEBHOOK_ALLOWED_NETWORKS") == ["127.0.0.0/8", "10.0.0.0/8"]
    assert read("NVKE_LOGIN_LOCKOUT") is False
    assert read("NVKE_CLUSTERAPI_MACHINE_SPEC") == {"image": {"url": "x"}}
    assert read("NVKE_MAX_DELETE_ATTEMPTS") == 12  # empty = unset
    # a default is a copy: changing what one reader got does not change the next
    read("NVKE_SIMULATED_FAILING_UPGRADES").append("GPU-x")
    assert read("NVKE_SIMULATED_FAILING_UPGRADES") == []


def test_read_refuses_an_undeclared_name_and_names_a_bad_value(monkeypatch):
    with pytest.raises(settings_registry.UndeclaredSetting, match="NVKE_NOPE is not declared"):
        read("NVKE_NOPE")
    monkeypatch.setenv("NVKE_MAX_DELETE_ATTEMPTS", "twelve")
    with pytest.raises(ValueError, match="NVKE_MAX_DELETE_ATTEMPTS: not a valid int"):
        read("NVKE_MAX_DELETE_ATTEMPTS")


def test_every_nvke_setting_is_a_django_setting_with_its_value(settings):
    from django.conf import settings as live

    for s in SETTINGS:
        if s.django and s.name != "NVKE_SIMULATED_HOSTS_DIR":
            assert hasattr(live, s.name), s.name


# ------------------------------------------------------------------------------- beat


def test_the_beat_schedule_has_each_periodic_task_once_and_nothing_else():
    from nvke.celery import app

    app.loader.import_default_modules()
    app.finalize()
    schedule = dict(app.conf.beat_schedule)
    tasks = [entry["task"] for entry in schedule.values()]
    assert len(tasks) == len(set(tasks)), tasks
    assert sorted(schedule) == sorted(p.name for p in PERIODIC_TASKS)
    assert sorted(tasks) == sorted(p.task for p in PERIODIC_TASKS)
    for name, entry in schedule.items():
        assert entry["task"] in app.tasks, f"{name}: {entry['task']} is not a registered task"
        assert 0 < entry["options"]["expires"] < entry["schedule"], name


def test_beat_periods_come_from_the_registry(monkeypatch):
    from nvke.beat_schedule import celery_beat_schedule

    values = {s.name: s.default for s in SETTINGS}
    values["NVKE_BILLING_INVOICE_INTERVAL_S"] = 120.0
    schedule = celery_beat_schedule(values)
    assert schedule["billing-build-invoices"]["schedule"] == 120.0
    assert schedule["billing-build-invoices"]["options"]["expires"] == 108.0
    assert schedule["resync-clusters"]["schedule"] == 15.0
