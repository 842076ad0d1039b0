"""``manage.py load_catalog [--extra FILE ...] [--prune]``: load catalog/data into the database."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError, CommandParser

from catalog.datafiles import CatalogDataError
from catalog.loader import load_catalog


class Command(BaseCommand):
    help = (
        "Load the GPU catalog (GPU models, MIG profiles, Kubernetes versions, driver branches, "
        "CUDA -> driver table, Xid codes) from catalog/data; idempotent. --extra adds GPU "
        "models from files shaped like gpu_models.yaml."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--extra",
            action="append",
            default=[],
            metavar="FILE",
            help="a YAML file shaped like gpu_models.yaml (repeatable)",
        )
        parser.add_argument(
            "--prune",
            action="store_true",
            help="delete MIG profiles of loaded models that the data no longer lists",
        )

    def handle(self, *args, **options) -> None:
        try:
            result = load_catalog(extra=options["extra"], prune=options["prune"])
        except CatalogDataError as exc:
            raise CommandError(f"catalog data error: {exc}") from exc
        for kind, count in result.counts.items():
            self.stdout.write(f"{kind}: {count} ({result.created.get(kind, 0)} created)")
        for label in result.pruned_profiles:
            self.stdout.write(f"pruned MIG profile {label}")
        for label in result.stale_profiles:
            self.stderr.write(f"warning: MIG profile {label} is no longer in the data (--prune)")
        self.stdout.write(self.style.SUCCESS("catalog loaded"))
