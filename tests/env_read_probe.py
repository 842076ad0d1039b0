"""Run NVKE with every environment read recorded; print the reads as JSON lines.

``python tests/env_read_probe.py [EXTRA_CODE]``: patches ``os._Environ.__getitem__`` (which
``os.environ[...]``, ``os.environ.get``, ``in``, ``setdefault``, ``os.getenv`` and
django-environ's ``Env`` all go through) BEFORE anything of NVKE is imported, then sets Django
up, imports every module of the project, and runs representative code: the fleet settings,
the tracing switch, the secrets check, the data-folder and port resolution of ``make run``,
gunicorn's configuration, the Celery app and its beat schedule, and a few requests through
the whole middleware stack. ``EXTRA_CODE`` (Python) runs last; the test uses it to prove a
read of an undeclared variable is caught.

Each line printed after ``--reads--`` is ``{"name", "file", "via_registry"}``: the variable, the
first file outside ``os`` / ``_collections_abc`` / django-environ that read it, and whether the
read went through ``nvke.settings_registry.read``.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import traceback

_reads: list[dict[str, object]] = []
_SKIP = (
    "/os.py", "<frozen os>", "/_collections_abc.py", "<frozen _collections_abc>",
    "/environ/environ.py", "/environ/__init__.py",
)  # fmt: skip
_orig_getitem = os._Environ.__getitem__


def _getitem(self, key):  # type: ignore[no-untyped-def]
    frame = sys._getframe(1)
    via = False
    where = None
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.endswith("nvke/settings_registry.py"):
            via = True
        elif where is None and not filename.endswith(_SKIP):
            where = filename
        frame = frame.f_back
    _reads.append({"name": key, "file": where or "?", "via_registry": via})
    return _orig_getitem(self, key)


os._Environ.__getitem__ = _getitem  # type: ignore[method-assign]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
APPS = (
    "nvke", "catalog", "tenants", "fleet", "reservations", "clusters", "nodepools", "billing",
    "webhooks", "portal",
)  # fmt: skip


def _import_everything() -> None:
    import importlib
    import pkgutil

    for app in APPS:
        package = importlib.import_module(app)
        for info in pkgutil.walk_packages(package.__path__, prefix=f"{app}."):
            if ".migrations" in info.name or info.name == "nvke.embedded.pytest_plugin":
                continue
            importlib.import_module(info.name)


def _representative() -> None:
    from django.conf import settings
    from django.test import Client

    from fleet import conf

    for name, value in vars(conf).items():
        if inspect.isfunction(value) and value.__module__ == conf.__name__ and name[0] != "_":
            value()
    for name in dir(settings):
        getattr(settings, name)

    from nvke import tracing
    from nvke.secrets_check import require_production_secrets

    tracing.enabled()
    require_production_secrets()

    from nvke.embedded import __main__ as runner
    from nvke.embedded.datadir import resolve_data_dir

    resolve_data_dir()
    os.environ["PORT"] = "0"  # any free port: resolve_port reads $PORT
    runner.resolve_port(None)

    from nvke.celery import app

    app.loader.import_default_modules()
    app.finalize()
    dict(app.conf.beat_schedule)

    client = Client()
    for path in ("/healthz", "/readyz", "/api/v1/clusters", "/portal/login/"):
        client.get(path)


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "nvke.settings")
    sys.path[:0] = [ROOT]
    import django

    django.setup()
    _import_everything()
    try:
        _representative()
    except Exception:  # the reads up to here still count; say what stopped it
        traceback.print_exc()
    if len(sys.argv) > 1:
        exec(sys.argv[1], {})
    print("--reads--")
    for read in _reads:
        print(json.dumps(read))


if __name__ == "__main__":
    main()
