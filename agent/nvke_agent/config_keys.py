"""Unknown configuration-file keys are refused, naming the key (a typo such as ``intreval``
would otherwise be ignored silently and the default used)."""

from __future__ import annotations

import argparse
from typing import Any


def known_keys(parser: argparse.ArgumentParser) -> set[str]:
    """Option names (``state-dir``) of every subcommand of ``parser``."""
    names: set[str] = set()
    for action in parser._actions:  # argparse exposes no public walk of subparsers
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                names |= known_keys(sub)
        for flag in action.option_strings:
            if flag.startswith("--"):
                names.add(flag[2:])
    return names - {"help", "version", "config"}


def unknown_keys(config: dict[str, Any], parser: argparse.ArgumentParser) -> list[str]:
    """Keys of ``config`` (already ``-``-separated) that no subcommand knows, sorted."""
    return sorted(set(config) - known_keys(parser))
