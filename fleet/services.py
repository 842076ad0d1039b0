"""Fleet use-cases: import a host from an ``nvidia-smi -q -x`` report, register its agent."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from nvke_agent.smi_xml import NotAnNvidiaSmiReport, SmiReport, parse_nvidia_smi_xml

from catalog.models import GpuModel
from catalog.services import match_product_name
from nvke.errors import Conflict, InvalidInput

from .choices import HostState
from .models import Gpu, Host
from .secrets import digest, new_token


@dataclass(frozen=True)
class ImportedHost:
    """The created host and its one-time bootstrap token (shown once, stored hashed)."""

    host: Host
    bootstrap_token: str


def import_host(*, hostname: str, zone: str, nvidia_smi_xml: str, rack: str = "") -> ImportedHost:
    """Create a host with the GPUs present in a real ``nvidia-smi -q -x`` report.

    Each GPU's product name must match a catalog GPU model. A report whose ``attached_gpus``
    differs from the ``<gpu>`` elements present is imported with a warning on the host.

    Raises InvalidInput (400: ``invalid_nvidia_smi_xml``, ``unknown_gpu_product``,
    ``mixed_gpu_models``, ``no_gpus``) or Conflict (409: ``duplicate_hostname``,
    ``duplicate_gpu_uuid``). Nothing is written when any check fails.
    """
    report = _parse(nvidia_smi_xml)
    model = _single_model(report)
    warnings: list[str] = []
    if report.attached_gpus is not None and report.attached_gpus != len(report.gpus):
        warnings.append(
            f"report says attached_gpus={report.attached_gpus} but contains "
            f"{len(report.gpus)} <gpu> element(s); imported the {len(report.gpus)} present"
        )
    token = new_token()
    try:
        with transaction.atomic():
            if Host.objects.filter(hostname=hostname).exists():
                raise Conflict(
                    f"a host named {hostname!r} already exists",
                    code="duplicate_hostname",
                    field="hostname",
                )
            _refuse_known_uuids(report)
            host = Host.objects.create(
                hostname=hostname,
                zone=zone,
                rack=rack,
                state=HostState.AVAILABLE,
                gpu_model=model,
                gpu_count=len(report.gpus),
                driver_version=report.driver_version or "",
                cuda_version=report.cuda_version or "",
                warnings=warnings,
                bootstrap_token_hash=digest(token),
                bootstrap_token_expires_at=timezone.now() + settings.NVKE_BOOTSTRAP_TOKEN_TTL,
            )
            Gpu.objects.bulk_create(
                [
                    Gpu(
                        uuid=g.uuid,
                        host=host,
                        index=g.index,
                        pci_bus_id=g.pci_bus_id,
                        minor_number=g.minor_number,
                        gpu_model=model,
                        product_name=g.product_name,
                        memory_total_bytes=g.memory_total_bytes,
                        mig_mode=g.mig_mode,
                        mig_devices=[_mig_device_dict(d) for d in g.mig_devices],
                    )
                    for g in report.gpus
                ]
            )
    except IntegrityError as exc:  # a concurrent import won the race for a name or UUID
        raise Conflict(
            "a host with this hostname or one of these GPU UUIDs was imported concurrently",
            code="duplicate_gpu_uuid",
            field="nvidia_smi_xml",
        ) from exc
    return ImportedHost(host=host, bootstrap_token=token)


def reissue_bootstrap_token(host: Host) -> str:
    """New one-time bootstrap token for ``host`` (the old one and the credential stop working)."""
    token = new_token()
    Host.objects.filter(pk=host.pk).update(
        bootstrap_token_hash=digest(token),
        bootstrap_token_expires_at=timezone.now() + settings.NVKE_BOOTSTRAP_TOKEN_TTL,
        bootstrap_token_used_at=None,
        credential_hash="",
    )
    return token


class InvalidBootstrapToken(Exception):
    """The bootstrap token is unknown, already used or expired."""


def register_agent(*, bootstrap_token: str, agent_version: str = "") -> tuple[Host, str]:
    """Exchange a one-time bootstrap token for a per-host credential.

    Returns ``(host, credential)``; the credential is shown once and stored hashed.
    Raises InvalidBootstrapToken.
    """
    now = timezone.now()
    credential = new_token()
    with transaction.atomic():
        host = (
            Host.objects.select_for_update()
            .filter(bootstrap_token_hash=digest(bootstrap_token), bootstrap_token_used_at=None)
            .exclude(bootstrap_token_hash="")
            .first()
        )
        if host is None:
            raise InvalidBootstrapToken("the bootstrap token is unknown or was already used")
        if host.bootstrap_token_expires_at and host.bootstrap_token_expires_at < now:
            raise InvalidBootstrapToken(
                "the bootstrap token has expired; ask an operator for a new one"
            )
        host.bootstrap_token_used_at = now
        host.credential_hash = digest(credential)
        host.registered_at = now
        host.agent_version = agent_version[:32]
        host.save(
            update_fields=[
                "bootstrap_token_used_at",
                "credential_hash",
                "registered_at",
                "agent_version",
            ]
        )
    return host, credential


def _parse(xml: str) -> SmiReport:
    try:
        report = parse_nvidia_smi_xml(xml)
    except NotAnNvidiaSmiReport as exc:
        raise InvalidInput(
            f"not an nvidia-smi -q -x report: {exc}",
            code="invalid_nvidia_smi_xml",
            field="nvidia_smi_xml",
        ) from exc
    if not report.gpus:
        raise InvalidInput(
            "the report contains no <gpu> element", code="no_gpus", field="nvidia_smi_xml"
        )
    return report


def _single_model(report: SmiReport) -> GpuModel:
    models: dict[str, GpuModel] = {}
    for gpu in report.gpus:
        model = match_product_name(gpu.product_name)
        if model is None:
            raise InvalidInput(
                f"GPU product {gpu.product_name!r} (GPU {gpu.uuid}) is not in the GPU catalog",
                code="unknown_gpu_product",
                field="nvidia_smi_xml",
                extra={"product_name": gpu.product_name},
            )
        models[model.slug] = model
    if len(models) > 1:
        raise InvalidInput(
            f"a host must hold one GPU model; the report has {sorted(models)}",
            code="mixed_gpu_models",
            field="nvidia_smi_xml",
        )
    return next(iter(models.values()))


def _refuse_known_uuids(report: SmiReport) -> None:
    known = (
        Gpu.objects.filter(uuid__in=[g.uuid for g in report.gpus]).select_related("host").first()
    )
    if known is not None:
        raise Conflict(
            f"GPU {known.uuid} already belongs to host {known.host.hostname}",
            code="duplicate_gpu_uuid",
            field="nvidia_smi_xml",
            extra={"gpu_uuid": known.uuid, "host": known.host.hostname},
        )


def _mig_device_dict(device) -> dict:
    return {
        "index": device.index,
        "gpu_instance_id": device.gpu_instance_id,
        "compute_instance_id": device.compute_instance_id,
        "uuid": device.uuid,
        "multiprocessor_count": device.multiprocessor_count,
        "memory_total_bytes": device.memory_total_bytes,
    }
