"""``manage.py create_operator_key NAME``: the first operator API key of a fresh installation
(printed once; store it in your secret manager). Later keys: ``POST /api/v1/operator-keys``."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from tenants.services import create_api_key


class Command(BaseCommand):
    help = "Create an operator API key and print it once."

    def add_arguments(self, parser):
        parser.add_argument("name")

    def handle(self, *args, name: str, **options):
        row, key = create_api_key(tenant=None, name=name[:50])
        self.stdout.write(key)
        self.stderr.write(f"operator key {row.prefix} created; it is shown only now")
