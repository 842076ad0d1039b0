"""``manage.py rotate_secrets``: re-encrypt every stored secret with the newest key of
``NVKE_SECRET_KEYS`` (MultiFernet.rotate), one transaction per row."""

from __future__ import annotations

from django.core.management.base import BaseCommand
from django.db import transaction

from clusters.models import Cluster
from nvke import crypto


class Command(BaseCommand):
    help = "Re-encrypt stored secrets (cluster kubeconfigs) with the newest NVKE_SECRET_KEYS key."

    def handle(self, *args, **options):
        rotated = 0
        for pk in Cluster.objects.exclude(kubeconfig_encrypted="").values_list("pk", flat=True):
            with transaction.atomic():
                cluster = Cluster.objects.select_for_update(no_key=True).get(pk=pk)
                cluster.kubeconfig_encrypted = crypto.rotate(cluster.kubeconfig_encrypted)
                cluster.save(update_fields=["kubeconfig_encrypted"])
                rotated += 1
        self.stdout.write(f"re-encrypted {rotated} secret(s) with the newest key")
