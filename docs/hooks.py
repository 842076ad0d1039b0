"""MkDocs hooks: the pages generated from the code, so they cannot go stale.

- ``reference/configuration.md`` from :data:`nvke.settings_registry.SETTINGS` (and the agent's
  own options, from its command line parser);
- ``reference/periodic-tasks.md`` from :data:`nvke.beat_schedule.PERIODIC_TASKS`.

Both are added as generated files (nothing is written under docs/); ``render_configuration``
and ``render_periodic_tasks`` are plain functions the tests call too.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT / "agent", ROOT):
    sys.path.insert(0, str(path))
# An installed nvke-agent imported before this hook (mkdocs' start-up may) would be another
# checkout's: drop it, so the agent's options are read from this repository's code.
for name in [m for m in sys.modules if m == "nvke_agent" or m.startswith("nvke_agent.")]:
    del sys.modules[name]

from mkdocs.structure.files import File, Files  # noqa: E402

# imported now: mkdocs puts sys.path back once the hook module is loaded
from nvke_agent.cli import environment_options  # noqa: E402

from nvke.beat_schedule import PERIODIC_TASKS  # noqa: E402
from nvke.settings_registry import SECTIONS, SETTINGS, Setting  # noqa: E402

GENERATED = {
    "reference/configuration.md": lambda: render_configuration(),
    "reference/periodic-tasks.md": lambda: render_periodic_tasks(),
}


def on_files(files: Files, config: Any) -> Files:
    for src_uri, render in GENERATED.items():
        files.append(File.generated(config, src_uri, content=render()))
    return files


def _default(s: Setting) -> str:
    value = s.default
    if s.kind == "bool":
        return "`true`" if value else "`false`"
    if s.kind == "list":
        return f"`{','.join(value)}`" if value else "(empty)"
    if s.kind == "json":
        import json

        return f"`{json.dumps(value)}`"
    if value == "":
        return "(empty)"
    return f"`{value}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_configuration() -> str:
    """The configuration reference in Markdown: one table per section of the registry."""
    out = [
        "# Configuration",
        "",
        "Every environment variable NVKE reads, generated from `nvke/settings_registry.py` "
        "(the one place a setting is declared; a test fails when code reads an `NVKE_*` "
        "variable that is not declared there). Unset or empty means the default. *Who*: "
        "`operator` — whoever runs NVKE; `developer` — tests and local runs.",
        "",
        "Types: `bool` takes `1`/`true`/`yes`/`on` (anything else is false), `list` is "
        "comma-separated, `json` a JSON document.",
        "",
    ]
    for section in SECTIONS:
        rows = [s for s in SETTINGS if s.section == section]
        if not rows:
            continue
        out += [f"## {section}", "", "| variable | type | default | unit | who | what |",
                "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
        for s in rows:
            out.append(
                f"| `{s.name}` | {s.kind} | {_cell(_default(s))} | {s.unit} | {s.audience} "
                f"| {_cell(s.help)} |"
            )
        out.append("")
    out += render_agent_options()
    return "\n".join(out) + "\n"


def render_agent_options() -> list[str]:
    """The agent's variables: ``nvke-agent``'s options, each also read as ``NVKE_<OPTION>``."""
    out = [
        "## The agent (`nvke-agent`)",
        "",
        "The agent is a separate program (it imports nothing of NVKE's server): each of its "
        "command-line options can also come from the environment variable below or a TOML "
        "file (`--config`); the command line wins over the environment, which wins over the "
        "file. Listed from the agent's own parser.",
        "",
        "| variable | option | commands | what |",
        "| --- | --- | --- | --- |",
    ]
    for name, entry in sorted(environment_options().items()):
        out.append(
            f"| `{name}` | `{entry['flag']}` | {', '.join(entry['commands'])} "
            f"| {_cell(entry['help'])} |"
        )
    return [*out, ""]


def _seconds(value: float) -> str:
    for unit, size in (("day", 86400), ("h", 3600), ("min", 60)):
        if value >= size and value % size == 0:
            n = int(value // size)
            return f"{n} {unit}{'s' if unit == 'day' and n > 1 else ''}"
    return f"{value:g} s"


def render_periodic_tasks() -> str:
    """The periodic tasks reference in Markdown, from the one beat schedule."""
    defaults = {s.name: s.default for s in SETTINGS}
    out = [
        "# Periodic tasks",
        "",
        "Every task Celery beat runs, generated from `nvke/beat_schedule.py` (the one "
        "schedule; no app adds entries of its own). A run still queued when its `expires` "
        "time has passed is dropped: the next one comes. Beat runs in one replica at a time "
        "(celery-redbeat's lock in Redis; another replica takes over within "
        "`CELERY_REDBEAT_LOCK_TIMEOUT`).",
        "",
        "| name | task | every | expires after | what |",
        "| --- | --- | --- | --- | --- |",
    ]
    for p in PERIODIC_TASKS:
        every = _seconds(p.period_s(defaults))
        if p.every_setting:
            every = f"`{p.every_setting}` ({every})"
        out.append(
            f"| `{p.name}` | `{p.task}` | {every} | {_seconds(p.expires(defaults))} "
            f"| {_cell(p.what)} |"
        )
    return "\n".join(out) + "\n"
