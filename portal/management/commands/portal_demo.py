"""``manage.py portal_demo``: what a person needs to try the portal on a fresh ``make run``.

* an operator login (``operator``, a Django superuser: console and ``/admin/``) and an owner
  login (``demo``) of the ``demo`` tenant ``seed_demo`` made; their passwords are written to
  ``DATA_DIR/portal-operator-password`` and ``DATA_DIR/portal-demo-password`` (mode 0600)
  unless ``--password`` is given; ``DATA_DIR`` is ``--data-dir``, else ``$NVKE_DATA_DIR``,
  else ``./.nvke`` (:func:`nvke.embedded.resolve_data_dir`, as ``make run`` resolves it);
* SIMULATED H100 hosts (``--h100-hosts``, default 2, 8 x H100-SXM5-80GB each, zone
  ``us-east-1a``, named ``sim-h100-NN``, GPU UUIDs ``GPU-sim-…``): no real H100
  ``nvidia-smi -q -x`` capture is vendored, so these are simulated hosts
  (``simhosts.create_simulated_host``, as seed_demo's) with no agent process: their agent
  reports in-process (driver 570.172.08);
* demo list prices for the catalog models that have none (:data:`DEMO_PRICES`, USD per
  GPU-hour, labelled as demo prices: made up, not anyone's real price).

Idempotent: a second run keeps existing users (and their passwords), hosts and prices.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from billing.models import Price
from billing.prices import set_price
from catalog.models import GpuModel
from clusters.providers import simhosts
from fleet.models import Host
from nvke.embedded.datadir import resolve_data_dir
from tenants.choices import Role
from tenants.models import Membership, Tenant

#: made-up USD list prices per GPU-hour for the demo (NOT real prices of anyone)
DEMO_PRICES = {
    "h100-sxm5-80gb": Decimal("2.50"),
    "a100-sxm4-80gb": Decimal("1.80"),
    "a10g": Decimal("0.75"),
    "t4": Decimal("0.35"),
    "gb200": Decimal("6.00"),
    "h200-sxm-141gb": Decimal("3.20"),
    "h100-nvl-94gb": Decimal("2.30"),
}
#: the demo's reservation rate per reserved GPU-hour: this share of the list price (made up)
DEMO_RESERVATION_SHARE = Decimal("0.70")
H100 = "h100-sxm5-80gb"


class Command(BaseCommand):
    help = "Portal logins, simulated H100 hosts and demo prices for trying the portal."

    def add_arguments(self, parser):
        parser.add_argument(
            "--data-dir", default=None, help="default: $NVKE_DATA_DIR, else ./.nvke"
        )
        parser.add_argument("--password", help="password of both logins (default: random)")
        parser.add_argument("--h100-hosts", type=int, default=2)
        parser.add_argument("--zone", default="us-east-1a")
        parser.add_argument("--tenant", default="demo")

    def handle(self, *args, data_dir: str | None, password, h100_hosts: int, zone: str, **options):
        root = resolve_data_dir(data_dir).resolve()  # the folder `make run` uses
        root.mkdir(parents=True, exist_ok=True)
        tenant, _ = Tenant.objects.get_or_create(name=options["tenant"])
        self._user(root / "portal-operator-password", "operator", password, staff=True)
        demo = self._user(root / "portal-demo-password", "demo", password)
        Membership.objects.get_or_create(user=demo, tenant=tenant, defaults={"role": Role.OWNER})
        for n in range(1, h100_hosts + 1):
            self._h100(f"sim-h100-{n:02d}", zone)
        for slug, rate in DEMO_PRICES.items():
            if GpuModel.objects.filter(slug=slug).exists() and not Price.objects.filter(
                gpu_model_id=slug, tenant__isnull=True
            ):
                reserved = (rate * DEMO_RESERVATION_SHARE).quantize(Decimal("0.01"))
                set_price(
                    gpu_model=slug,
                    hourly_rate=rate,
                    reservation_hourly_rate=reserved,
                    effective_from=datetime(2020, 1, 1, tzinfo=UTC),
                    label="demo list price (made up)",
                )
                self.stdout.write(
                    f"demo list price {slug}: {rate} USD / GPU-hour, reserved {reserved}"
                )
        unpriced = sorted(
            set(Host.objects.values_list("gpu_model_id", flat=True))
            - set(Price.objects.filter(tenant__isnull=True).values_list("gpu_model_id", flat=True))
        )
        if unpriced:  # an invoice of usage on them would fail with missing_price
            self.stdout.write(
                self.style.WARNING(
                    f"no list price for {', '.join(unpriced)}: add one with manage.py billing "
                    "price before tenants use them"
                )
            )
        self.stdout.write(self.style.SUCCESS("portal demo ready: log in at /login"))

    def _user(self, path: Path, username: str, password: str | None, *, staff: bool = False):
        User = get_user_model()
        user = User.objects.filter(username__iexact=username).first()
        if user is not None:
            self.stdout.write(f"login {username} exists (password unchanged)")
            return user
        if password:  # a chosen password passes AUTH_PASSWORD_VALIDATORS like any other
            try:
                validate_password(password, user=User(username=username))
            except ValidationError as exc:
                raise CommandError(f"--password: {' '.join(exc.messages)}") from exc
        password = password or secrets.token_urlsafe(12)
        if staff:
            user = User.objects.create_superuser(username=username, password=password)
        else:
            user = User.objects.create_user(username=username, password=password)
        path.write_text(password + "\n")
        path.chmod(0o600)
        self.stdout.write(f"login {username}: password in {path}")
        return user

    def _h100(self, hostname: str, zone: str) -> None:
        """A SIMULATED H100 host like seed_demo's (``simhosts.create_simulated_host``): its
        in-process agent reports the simulated driver (570.172.08) as every other simulated
        host does; rows made here by hand reported none, so their nodes' driver read "—"."""
        if Host.objects.filter(hostname=hostname).exists():
            return
        simhosts.create_simulated_host(hostname=hostname, zone=zone, gpu_model=H100, gpus=8)
        self.stdout.write(f"SIMULATED host {hostname}: 8 x {H100} in {zone}")
