"""Sourced GPU facts: GPU models, MIG GPU-instance profiles, Kubernetes versions, drivers, Xids.

Rows are loaded from the vendored data in ``catalog/data/`` (copied from the project's shared
catalog, each fact with its source) by ``manage.py load_catalog``; operators may add rows
without code (admin / ``load_catalog --extra FILE``). The API is read-only.
Every row keeps the source strings it was built from in ``sources``: a list of
``{"field": str, "value": str | None, "source": str | list[str]}``.
"""

from __future__ import annotations

import re
from datetime import date

from django.contrib.postgres.fields import ArrayField
from django.core.exceptions import ValidationError
from django.db import models

_MINOR_RE = re.compile(r"^(\d+)\.(\d+)$")


class GpuModel(models.Model):
    """A GPU product, keyed by a stable lower-case catalog slug (``a100-sxm4-80gb``).

    ``product_names`` are the names NVML / ``nvidia-smi`` print (``NVIDIA A100-SXM4-80GB``,
    ``Tesla T4``); a host import matches a GPU's product name against them.
    ``memory_mib`` is the NVML total (MiB) when known. MIG support is a per-product fact.
    """

    slug = models.SlugField(primary_key=True, max_length=64)
    name = models.CharField(max_length=64, help_text="catalog key, e.g. A100-SXM4-80GB")
    product_names = ArrayField(models.CharField(max_length=128), default=list, blank=True)
    architecture = models.CharField(max_length=32, blank=True)
    compute_capability = models.CharField(max_length=8, blank=True)
    pci_device_id = models.CharField(max_length=16, blank=True)
    memory_mib = models.PositiveIntegerField(null=True, blank=True)
    mig_capable = models.BooleanField(default=False)
    #: compute / memory slices of a MIG-capable GPU: 7 / 8, or 4 / 4 on A30 (MIG user guide).
    mig_compute_slices = models.PositiveSmallIntegerField(null=True, blank=True)
    mig_memory_slices = models.PositiveSmallIntegerField(null=True, blank=True)
    max_mig_instances = models.PositiveSmallIntegerField(null=True, blank=True)
    #: True when the MIG placements come from a real ``nvidia-smi mig -lgipp`` capture.
    placements_verified = models.BooleanField(default=False)
    #: vGPU "mixed-size mode": time-sliced vGPU types of different framebuffer sizes may share
    #: one GPU (vgpu_profiles.yaml). None = not found in public material (NVKE refuses mixes).
    vgpu_mixed_size_mode = models.BooleanField(null=True, blank=True)
    sources = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class MigProfile(models.Model):
    """A MIG GPU-instance profile of one GPU model (``1g.10gb`` on H100-80GB).

    ``placement_starts`` / ``placement_size`` are ``nvidia-smi mig -lgipp``'s
    ``{0,2,4}:2``: the valid start memory slices and the memory slices one instance takes.
    ``aliases`` are other names seen for the same profile on other drivers (``3g.39gb``).
    """

    gpu_model = models.ForeignKey(GpuModel, on_delete=models.CASCADE, related_name="mig_profiles")
    name = models.CharField(max_length=32)
    aliases = ArrayField(models.CharField(max_length=32), default=list, blank=True)
    nvml_profile = models.CharField(max_length=64, blank=True)
    nvidia_smi_id = models.PositiveSmallIntegerField(null=True, blank=True)
    compute_slices = models.PositiveSmallIntegerField()
    memory_slices = models.PositiveSmallIntegerField()
    max_instances = models.PositiveSmallIntegerField()
    placement_starts = ArrayField(models.PositiveSmallIntegerField(), default=list, blank=True)
    placement_size = models.PositiveSmallIntegerField(null=True, blank=True)
    placements_verified = models.BooleanField(default=False)
    memory_mib = models.PositiveIntegerField(null=True, blank=True)
    sources = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["gpu_model", "compute_slices", "memory_slices", "name"]
        constraints = [
            models.UniqueConstraint(fields=["gpu_model", "name"], name="migprofile_model_name_uniq")
        ]

    def __str__(self) -> str:
        return f"{self.gpu_model_id}/{self.name}"

    @property
    def media_extensions(self) -> bool:
        """``+me`` profile: owns the media engines; at most one per GPU (MIG user guide)."""
        return self.name.endswith("+me")

    @property
    def placements(self) -> str:
        """The ``-lgipp`` notation, e.g. ``{0,2,4}:2``; empty when no placement is known."""
        if not self.placement_starts or self.placement_size is None:
            return ""
        return (
            "{" + ",".join(str(s) for s in self.placement_starts) + "}:" + str(self.placement_size)
        )


class KubernetesVersion(models.Model):
    """A Kubernetes minor release NVKE offers, with its upstream support dates.

    ``major`` / ``minor`` are derived from ``version`` on save (they order the list:
    ``1.10`` sorts after ``1.9``). Supported on a day ``d`` means ``released <= d <= end_of_life``.
    """

    version = models.CharField(primary_key=True, max_length=16, help_text="minor, e.g. 1.34")
    major = models.PositiveSmallIntegerField(editable=False, default=1)
    minor = models.PositiveSmallIntegerField(editable=False, default=0)
    released = models.DateField()
    end_of_life = models.DateField()
    source = models.CharField(max_length=300)

    class Meta:
        ordering = ["-major", "-minor"]

    def __str__(self) -> str:
        return self.version

    def save(self, *args, **kwargs) -> None:
        match = _MINOR_RE.match(self.version or "")
        if match is None:
            raise ValidationError({"version": f"{self.version!r} is not a minor version like 1.34"})
        self.major, self.minor = int(match.group(1)), int(match.group(2))
        if kwargs.get("update_fields") is not None:  # update_or_create names the fields it set
            kwargs["update_fields"] = {*kwargs["update_fields"], "major", "minor"}
        super().save(*args, **kwargs)

    def clean(self) -> None:
        if not _MINOR_RE.match(self.version or ""):
            raise ValidationError({"version": "a minor version like 1.34"})
        if self.released and self.end_of_life and self.end_of_life < self.released:
            raise ValidationError({"end_of_life": "end of life before the release date"})

    def is_supported(self, today: date) -> bool:
        """Released and not past end of life on ``today``."""
        return self.released <= today <= self.end_of_life


class GpuArchitecture(models.Model):
    """A GPU architecture with the CUDA / driver range that supports it.

    From drivers.yaml ``architectures`` (NVIDIA "CUDA Toolkit, Driver, and Architecture
    Matrix"). ``min_driver`` is the *derived* minimum Linux driver (first CUDA toolkit of the
    architecture joined with the toolkit -> driver table); ``last_driver_branch`` is the last
    branch that supports it (``R580`` for Volta), blank while support is ongoing.
    """

    name = models.SlugField(primary_key=True, max_length=32, help_text="lower-case, e.g. hopper")
    compute_capabilities = ArrayField(models.CharField(max_length=8), default=list, blank=True)
    first_cuda = models.CharField(max_length=64, blank=True)
    min_driver = models.CharField(max_length=32, blank=True)
    last_driver_branch = models.CharField(max_length=8, blank=True)
    sources = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class DriverBranch(models.Model):
    """An NVIDIA data-center driver branch (``R580``): designation, end of life, architectures.

    ``end_of_life`` is the text NVIDIA prints ("June 2028"; sources that disagree are joined
    with `` / ``). ``architectures`` lists the architectures the branch supports, derived from
    :class:`GpuArchitecture` (min driver <= branch, and branch <= last supporting branch).
    """

    class Designation(models.TextChoices):
        LTSB = "LTSB", "Long Term Support Branch"
        PB = "PB", "Production Branch"
        NFB = "NFB", "New Feature Branch"
        UNKNOWN = "", "unknown"

    branch = models.CharField(primary_key=True, max_length=8, help_text="e.g. R580")
    number = models.PositiveSmallIntegerField()
    designation = models.CharField(max_length=4, choices=Designation.choices, blank=True)
    end_of_life = models.CharField(max_length=200, blank=True)
    max_cuda = models.CharField(max_length=100, blank=True)
    architectures = ArrayField(models.CharField(max_length=32), default=list, blank=True)
    notes = models.TextField(blank=True)
    sources = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["-number"]

    def __str__(self) -> str:
        return self.branch


class CudaDriverRequirement(models.Model):
    """One CUDA toolkit release and the minimum Linux driver it needs (CUDA release notes).

    ``label`` is the release as NVIDIA prints it (``12.4 Update 1``); ``cuda_version`` its
    minor version (``12.4``) and ``update`` its update number (GA = 0, RC = -1 is not stored).
    ``family_min_driver`` is the minor-version-compatibility floor of the major family
    (12.x >= 525): an app built with this toolkit runs there with a limited feature set.
    """

    label = models.CharField(primary_key=True, max_length=32)
    cuda_version = models.CharField(max_length=8)
    update = models.PositiveSmallIntegerField(default=0)
    min_linux_driver = models.CharField(max_length=32)
    min_windows_driver = models.CharField(max_length=32, blank=True)
    family_min_driver = models.CharField(max_length=32, blank=True)
    sources = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["cuda_version", "update"]

    def __str__(self) -> str:
        return self.label


class XidCode(models.Model):
    """An NVIDIA Xid error code with NVKE's severity and operator action (xid.yaml).

    ``nvidia_*`` fields are NVIDIA's catalog text; ``severity`` / ``operator_action`` are
    NVKE's mapping of NVIDIA's resolution bucket. ``device_plugin_marks_unhealthy`` is the
    NVIDIA k8s device plugin's behaviour (None when the data does not say).
    """

    class Severity(models.TextChoices):
        INFO = "info"
        WARNING = "warning"
        CRITICAL = "critical"

    code = models.PositiveIntegerField(primary_key=True)
    mnemonic = models.CharField(max_length=100, blank=True)
    description = models.CharField(max_length=300, blank=True)
    severity = models.CharField(max_length=8, choices=Severity.choices)
    severity_note = models.CharField(max_length=300, blank=True)
    operator_action = models.TextField(blank=True)
    nvidia_immediate_action = models.CharField(max_length=100, blank=True)
    nvidia_investigatory_action = models.CharField(max_length=100, blank=True)
    device_plugin_marks_unhealthy = models.BooleanField(null=True, blank=True)
    applies_to = models.JSONField(default=dict, blank=True)
    sources = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["code"]

    def __str__(self) -> str:
        return f"Xid {self.code}"


class VgpuProfile(models.Model):
    """An NVIDIA vGPU type a GPU model can host (``A10-12Q``, ``T4-8C``, ``H200-1-18C``).

    Time-sliced types have ``framebuffer_mib`` (the type table's GB x 1024) and
    ``max_per_gpu`` ("Maximum vGPUs per GPU", equal-size mode); MIG-backed types name the
    ``mig_profile`` whose GPU instance backs each vGPU (one vGPU per instance), and how many
    fit is decided by the MIG placement rules. ``series`` is the type letter (``C`` compute,
    ``Q``). Loaded from ``vgpu_profiles.yaml``; ``verified`` False marks names or counts not
    seen in an NVIDIA table of that exact product.
    """

    gpu_model = models.ForeignKey(GpuModel, on_delete=models.CASCADE, related_name="vgpu_profiles")
    name = models.CharField(max_length=32)
    series = models.CharField(max_length=4, blank=True)
    framebuffer_mib = models.PositiveIntegerField(null=True, blank=True)
    max_per_gpu = models.PositiveSmallIntegerField(null=True, blank=True)
    mig_profile = models.ForeignKey(
        MigProfile, on_delete=models.CASCADE, null=True, blank=True, related_name="+"
    )
    verified = models.BooleanField(default=False)
    sources = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["gpu_model", "mig_profile", "-framebuffer_mib", "name"]
        constraints = [
            models.UniqueConstraint(
                fields=["gpu_model", "name"], name="vgpuprofile_model_name_uniq"
            ),
            models.CheckConstraint(
                condition=models.Q(mig_profile__isnull=False)
                | models.Q(framebuffer_mib__isnull=False, max_per_gpu__isnull=False),
                name="vgpuprofile_time_sliced_has_size",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.gpu_model_id}/{self.name}"

    @property
    def mig_backed(self) -> bool:
        return self.mig_profile_id is not None


class DriverRule(models.Model):
    """A driver requirement beyond architecture and CUDA toolkit (``driver_rules.yaml``).

    ``kind``: ``gpu_min_driver`` (``gpu_model`` needs driver >= ``min_driver``, a full
    version), ``mig_profile_min_branch`` (MIG profile ``mig_profile`` of ``gpu_model`` needs
    branch >= ``min_branch``), ``mig_combination_min_branch`` (instances with all of
    ``compute_slices`` on one GPU need ``min_branch``; any MIG model).
    """

    class Kind(models.TextChoices):
        GPU_MIN_DRIVER = "gpu_min_driver"
        MIG_PROFILE_MIN_BRANCH = "mig_profile_min_branch"
        MIG_COMBINATION_MIN_BRANCH = "mig_combination_min_branch"

    key = models.CharField(primary_key=True, max_length=100)
    kind = models.CharField(max_length=32, choices=Kind.choices)
    gpu_model = models.ForeignKey(
        GpuModel, on_delete=models.CASCADE, null=True, blank=True, related_name="driver_rules"
    )
    mig_profile = models.CharField(max_length=32, blank=True)
    compute_slices = ArrayField(models.PositiveSmallIntegerField(), default=list, blank=True)
    min_driver = models.CharField(max_length=32, blank=True)
    min_branch = models.CharField(max_length=8, blank=True)
    note = models.CharField(max_length=300, blank=True)
    sources = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["key"]

    def __str__(self) -> str:
        return self.key


class GpuSystem(models.Model):
    """A rack-scale GPU system whose NVLink domain spans several hosts (``gpu_systems.yaml``).

    NVKE's host is one **compute tray** of the system (one OS image, one agent). A tray holds
    ``gpus_per_tray`` GPUs of ``gpu_model`` and ``grace_cpus_per_tray`` CPUs; the system has
    ``compute_trays`` of them and ``nvlink_domain_gpus`` GPUs share one NVLink domain
    (GB200 NVL72: 18 trays x 4 GPUs = 72 GPUs, 36 Grace CPUs, 9 NVLink switch trays; sources in
    ``sources``). Which trays actually share a domain is what NVML reports per GPU (fabric
    cluster UUID + clique id), stored on the host (:mod:`fleet.nvlink_domains`).
    """

    slug = models.SlugField(primary_key=True, max_length=64)
    name = models.CharField(max_length=100)
    gpu_model = models.ForeignKey(GpuModel, on_delete=models.CASCADE, related_name="systems")
    compute_trays = models.PositiveSmallIntegerField()
    gpus_per_tray = models.PositiveSmallIntegerField()
    grace_cpus_per_tray = models.PositiveSmallIntegerField(null=True, blank=True)
    nvlink_switch_trays = models.PositiveSmallIntegerField(null=True, blank=True)
    nvlink_domain_gpus = models.PositiveSmallIntegerField()
    sources = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug

    @property
    def domain_trays(self) -> int:
        """Compute trays (NVKE hosts) in one NVLink domain (72 / 4 = 18 on a GB200 NVL72)."""
        return self.nvlink_domain_gpus // self.gpus_per_tray
