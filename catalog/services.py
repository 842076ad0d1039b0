"""What other apps ask the catalog: GPU models, MIG profiles, Kubernetes versions, drivers, Xids.

Every lookup raises a :class:`CatalogError` subclass (a ValueError) that carries the data as
attributes and a message a person can act on; the API layer turns them into problem+json.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date

from django.utils import timezone

from .datafiles import version_tuple
from .models import (
    CudaDriverRequirement,
    DriverBranch,
    DriverRule,
    GpuArchitecture,
    GpuModel,
    KubernetesVersion,
    MigProfile,
    VgpuProfile,
    XidCode,
)

_KUBERNETES_RE = re.compile(r"^v?([0-9]+)\.([0-9]+)(?:\.([0-9]+))?$")
_CUDA_RE = re.compile(r"^([0-9]+)\.([0-9]+)(?:\.([0-9]+))?$")


class CatalogError(ValueError):
    """Base of the catalog's lookup errors; ``code`` is stable for programs."""

    code = "catalog_error"


class UnknownGpuModel(CatalogError):
    """No GPU model has this slug. ``valid`` lists the slugs that exist."""

    code = "unknown_gpu_model"

    def __init__(self, slug: str, valid: list[str]) -> None:
        self.slug = slug
        self.valid = valid
        super().__init__(f"unknown GPU model {slug!r}; valid: {', '.join(valid) or 'none loaded'}")


class MigNotSupported(CatalogError):
    """The GPU model has no MIG (e.g. T4, L40S)."""

    code = "mig_not_supported"

    def __init__(self, gpu_model: GpuModel) -> None:
        self.gpu_model = gpu_model
        super().__init__(f"{gpu_model.slug} does not support MIG")


class UnknownMigProfile(CatalogError):
    """The name is neither a MIG profile nor an alias of one on this GPU model."""

    code = "unknown_mig_profile"

    def __init__(self, gpu_model: GpuModel, name: str, valid: list[str]) -> None:
        self.gpu_model = gpu_model
        self.name = name
        self.valid = valid
        super().__init__(
            f"{name!r} is not a MIG profile of {gpu_model.slug}; valid: {', '.join(valid)}"
        )


class UnsupportedKubernetesVersion(CatalogError):
    """Unknown, malformed, not yet released or past end of life; ``supported`` lists minors."""

    code = "unsupported_kubernetes_version"

    def __init__(self, version: str, supported: list[str], reason: str = "") -> None:
        self.version = version
        self.supported = supported
        self.reason = reason or "is not a Kubernetes version NVKE offers"
        super().__init__(
            f"Kubernetes {version!r} {self.reason}; supported: {', '.join(supported) or 'none'}"
        )


class UnknownCudaVersion(CatalogError):
    """No CUDA toolkit release with this version is in the catalog."""

    code = "unknown_cuda_version"

    def __init__(self, version: str, known: list[str]) -> None:
        self.version = version
        self.known = known
        super().__init__(f"unknown CUDA version {version!r}; known: {', '.join(known)}")


def _normalise(name: str) -> str:
    return " ".join(name.split()).casefold()


def match_product_name(product_name: str) -> GpuModel | None:
    """The GPU model whose NVML product names include ``product_name``.

    Exact match, case-insensitive, whitespace-normalised: ``"NVIDIA A100-SXM4-80GB"`` ->
    a100-sxm4-80gb, ``"Tesla T4"`` -> t4; None for a product the catalog does not know.
    (The loader keeps product names unique across models.)
    """
    wanted = _normalise(product_name)
    if not wanted:
        return None
    for model in GpuModel.objects.exclude(product_names=[]):
        if any(_normalise(name) == wanted for name in model.product_names):
            return model
    return None


def get_gpu_model(slug: str) -> GpuModel:
    """The GPU model with this catalog slug; raises :class:`UnknownGpuModel`."""
    try:
        return GpuModel.objects.get(slug=slug)
    except GpuModel.DoesNotExist:
        raise UnknownGpuModel(
            slug, list(GpuModel.objects.order_by("slug").values_list("slug", flat=True))
        ) from None


def resolve_mig_profile(gpu_model: GpuModel, name: str) -> MigProfile:
    """The MIG profile ``name`` (or a known alias, e.g. ``3g.39gb``) of ``gpu_model``.

    Raises :class:`MigNotSupported` for a model without MIG and :class:`UnknownMigProfile`
    when the name is not a profile of this model (``1g.18gb`` is H200, not A100).
    """
    if not gpu_model.mig_capable:
        raise MigNotSupported(gpu_model)
    profiles = MigProfile.objects.filter(gpu_model=gpu_model)
    wanted = name.strip()
    profile = (
        profiles.filter(name=wanted).first() or profiles.filter(aliases__contains=[wanted]).first()
    )
    if profile is None:
        raise UnknownMigProfile(gpu_model, name, list(profiles.values_list("name", flat=True)))
    return profile


def supported_kubernetes_versions(today: date | None = None) -> list[KubernetesVersion]:
    """Minors supported on ``today`` (default: today, UTC), newest first."""
    today = today or timezone.now().date()
    return list(KubernetesVersion.objects.filter(released__lte=today, end_of_life__gte=today))


def runnable_kubernetes_minors() -> frozenset[str] | None:
    """The minors (``{"1.36", "1.37"}``) this installation can create clusters of, as the
    receivers of :data:`catalog.signals.runnable_kubernetes_minors` say (every receiver's,
    intersected); None when none limits them (any supported version runs)."""
    from .signals import runnable_kubernetes_minors as asked

    out: frozenset[str] | None = None
    for _receiver, minors in asked.send(sender=KubernetesVersion):
        if minors is not None:
            out = frozenset(minors) if out is None else out & frozenset(minors)
    return out


def check_kubernetes_version(version: str, today: date | None = None) -> KubernetesVersion:
    """The catalog row of a supported Kubernetes version.

    Accepts ``"1.34"``, ``"1.34.2"`` and ``"v1.34.2"`` (the patch is ignored for the lookup).
    Raises :class:`UnsupportedKubernetesVersion` when it is malformed, unknown, not yet
    released or past its end of life on ``today`` (default: today, UTC).
    """
    today = today or timezone.now().date()
    supported = [kv.version for kv in supported_kubernetes_versions(today)]
    match = _KUBERNETES_RE.match(version.strip())
    if match is None:
        raise UnsupportedKubernetesVersion(version, supported, "is not a version like 1.34")
    minor = f"{int(match.group(1))}.{int(match.group(2))}"
    row = KubernetesVersion.objects.filter(version=minor).first()
    if row is None:
        raise UnsupportedKubernetesVersion(version, supported)
    if today > row.end_of_life:
        raise UnsupportedKubernetesVersion(
            version, supported, f"reached end of life on {row.end_of_life.isoformat()}"
        )
    if today < row.released:
        raise UnsupportedKubernetesVersion(
            version, supported, f"is not released until {row.released.isoformat()}"
        )
    return row


def minimum_driver_for_cuda(cuda_version: str) -> CudaDriverRequirement:
    """The CUDA toolkit release and its minimum Linux driver (CUDA release notes, Table 3).

    ``"12.4"`` -> the 12.4 GA row (>= 550.54.14); ``"12.4.1"`` -> 12.4 Update 1; a label as
    printed (``"11.0.3 Update 1"``) also works. Raises :class:`UnknownCudaVersion`.
    """
    text = " ".join(cuda_version.split())
    row = CudaDriverRequirement.objects.filter(label=text).first()
    match = _CUDA_RE.match(text)
    if row is None and match is not None:
        minor = f"{int(match.group(1))}.{int(match.group(2))}"
        if match.group(3) is None:
            row = CudaDriverRequirement.objects.filter(cuda_version=minor, update=0).first()
        else:
            row = (
                CudaDriverRequirement.objects.filter(label__startswith=f"{text} ").first()
                or CudaDriverRequirement.objects.filter(
                    cuda_version=minor, update=int(match.group(3))
                ).first()
            )
    if row is None:
        known = sorted(
            set(CudaDriverRequirement.objects.values_list("cuda_version", flat=True)),
            key=version_tuple,
        )
        raise UnknownCudaVersion(cuda_version, known)
    return row


def get_xid_code(code: int) -> XidCode | None:
    """The catalog entry of an Xid (severity, operator action), or None when not catalogued."""
    return XidCode.objects.filter(code=code).first()


class UnknownVgpuProfile(CatalogError):
    """The name is not a vGPU type of this GPU model; ``valid`` lists those that are."""

    code = "unknown_vgpu_profile"

    def __init__(self, gpu_model: GpuModel, name: str, valid: list[str]) -> None:
        self.gpu_model = gpu_model
        self.name = name
        self.valid = valid
        super().__init__(
            f"{name!r} is not a vGPU type of {gpu_model.slug}; valid: {', '.join(valid) or 'none'}"
        )


def resolve_vgpu_profile(gpu_model: GpuModel, name: str) -> VgpuProfile:
    """The vGPU type ``name`` of ``gpu_model`` (exact name, case-insensitive).

    Raises :class:`UnknownVgpuProfile` (``valid`` empty when the catalog has no vGPU types
    for the model).
    """
    profiles = list(VgpuProfile.objects.filter(gpu_model=gpu_model).select_related("mig_profile"))
    wanted = name.strip().casefold()
    for profile in profiles:
        if profile.name.casefold() == wanted:
            return profile
    raise UnknownVgpuProfile(gpu_model, name, [p.name for p in profiles])


_DRIVER_RE = re.compile(r"^(?:[Rr]([0-9]{3})|([0-9]{3})(?:\.([0-9]+)(?:\.([0-9]+))?)?)$")


@dataclass(frozen=True)
class DriverVersion:
    """A pool's driver: a branch (``R580``, ``580``) or an exact release (``580.95.05``).

    A branch alone stands for its newest release: it meets a minimum ``570.133.20`` when its
    number is at least 570 (the operator installs the branch's current release).
    """

    text: str
    branch: int
    exact: tuple[int, ...] | None

    @property
    def branch_name(self) -> str:
        return f"R{self.branch}"

    def at_least(self, minimum: str) -> bool:
        required = version_tuple(minimum)
        if self.exact is None:
            return self.branch >= required[0]
        return self.exact >= required


def parse_driver_version(text: str) -> DriverVersion:
    """``"R580"`` / ``"580"`` (branch) or ``"580.95.05"`` (release); raises ValueError."""
    match = _DRIVER_RE.match(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a driver branch (R580) or version (580.95.05)")
    if match.group(1):
        return DriverVersion(text.strip(), int(match.group(1)), None)
    parts = tuple(int(p) for p in match.group(2, 3, 4) if p is not None)
    exact = parts if len(parts) > 1 else None
    return DriverVersion(text.strip(), parts[0], exact)


def driver_matches(wanted: str, reported: str) -> bool:
    """Whether a host reporting driver ``reported`` runs what ``wanted`` pins: ``R580`` /
    ``580`` match any 580 release, ``580.95.05`` only itself, "" (no pin) anything; nothing
    reported matches only "". Used by the observed-state gates and by the rule of who may
    change a host's driver (:mod:`fleet.host_driver`)."""
    if not wanted:
        return True
    if not reported:
        return False
    try:
        want, have = parse_driver_version(wanted), parse_driver_version(reported)
    except ValueError:
        return wanted == reported
    if want.exact is None:
        return want.branch == have.branch
    return want.exact == have.exact


@dataclass(frozen=True)
class DriverProblem:
    """Why a driver cannot serve a pool: stable ``code``, the spec ``field`` at fault."""

    code: str
    field: str
    message: str
    minimum: str = ""


def driver_problems(
    gpu_model: GpuModel,
    driver: DriverVersion,
    *,
    cuda_version: str | None = None,
    mig_profiles: Iterable[MigProfile] = (),
) -> list[DriverProblem]:
    """Every reason ``driver`` cannot run ``gpu_model`` (with these MIG profiles on one GPU).

    Checks, in order (sources in drivers.yaml / driver_rules.yaml):

    * ``unknown_driver_branch``: the branch is not in the catalog;
    * ``driver_architecture_unsupported``: the branch does not support the GPU's
      architecture (``DriverBranch.architectures``: from the architecture's first CUDA
      toolkit's driver up to its last supporting branch), or an exact release is below the
      architecture's minimum driver;
    * ``driver_too_old_for_gpu``: a product minimum (HGX B200 >= 570.133.20);
    * ``driver_too_old_for_cuda``: below the CUDA toolkit's minimum Linux driver (CUDA
      release notes, Table 3; minor-version compatibility is not assumed). An unknown CUDA
      version is ``unknown_cuda_version`` on ``cuda_version``;
    * ``driver_too_old_for_mig_profile``: a MIG profile or combination needs a newer branch.
    """
    problems: list[DriverProblem] = []
    field = "driver_version"
    branch = DriverBranch.objects.filter(number=driver.branch).first()
    if branch is None:
        known = ", ".join(DriverBranch.objects.order_by("number").values_list("branch", flat=True))
        return [
            DriverProblem(
                "unknown_driver_branch",
                field,
                f"driver branch {driver.branch_name} is not in the catalog; known: {known}",
            )
        ]
    arch = GpuArchitecture.objects.filter(name=gpu_model.architecture).first()
    if gpu_model.architecture and gpu_model.architecture not in branch.architectures:
        supported = ", ".join(branch.architectures)
        problems.append(
            DriverProblem(
                "driver_architecture_unsupported",
                field,
                f"driver branch {branch.branch} does not support {gpu_model.name} "
                f"({gpu_model.architecture}); {branch.branch} supports: {supported}",
                arch.min_driver if arch is not None else "",
            )
        )
    elif arch is not None and arch.min_driver and not driver.at_least(arch.min_driver):
        problems.append(
            DriverProblem(
                "driver_architecture_unsupported",
                field,
                f"{gpu_model.name} ({arch.name}) needs driver >= {arch.min_driver}",
                arch.min_driver,
            )
        )
    for rule in DriverRule.objects.filter(
        kind=DriverRule.Kind.GPU_MIN_DRIVER, gpu_model=gpu_model
    ).order_by("key"):
        if not driver.at_least(rule.min_driver):
            problems.append(
                DriverProblem(
                    "driver_too_old_for_gpu",
                    field,
                    f"{gpu_model.name} needs driver >= {rule.min_driver} ({rule.note})",
                    rule.min_driver,
                )
            )
    if cuda_version:
        try:
            cuda = minimum_driver_for_cuda(cuda_version)
        except UnknownCudaVersion as exc:
            problems.append(DriverProblem("unknown_cuda_version", "cuda_version", str(exc)))
        else:
            if not driver.at_least(cuda.min_linux_driver):
                problems.append(
                    DriverProblem(
                        "driver_too_old_for_cuda",
                        field,
                        f"CUDA {cuda.label} needs driver >= {cuda.min_linux_driver}; "
                        f"{driver.text} is older",
                        cuda.min_linux_driver,
                    )
                )
    problems += _mig_driver_problems(gpu_model, driver, list(mig_profiles))
    return problems


def _mig_driver_problems(
    gpu_model: GpuModel, driver: DriverVersion, profiles: list[MigProfile]
) -> list[DriverProblem]:
    if not profiles:
        return []
    problems = []
    names = {p.name for p in profiles}
    for rule in DriverRule.objects.filter(
        kind=DriverRule.Kind.MIG_PROFILE_MIN_BRANCH, gpu_model=gpu_model, mig_profile__in=names
    ).order_by("key"):
        if not driver.at_least(rule.min_branch.lstrip("R")):
            problems.append(
                DriverProblem(
                    "driver_too_old_for_mig_profile",
                    "driver_version",
                    f"MIG profile {rule.mig_profile} needs driver branch >= {rule.min_branch}",
                    rule.min_branch,
                )
            )
    slices = {p.compute_slices for p in profiles}
    for rule in DriverRule.objects.filter(kind=DriverRule.Kind.MIG_COMBINATION_MIN_BRANCH):
        if set(rule.compute_slices) <= slices and not driver.at_least(rule.min_branch.lstrip("R")):
            combo = " + ".join(f"{c}g" for c in sorted(rule.compute_slices, reverse=True))
            problems.append(
                DriverProblem(
                    "driver_too_old_for_mig_profile",
                    "driver_version",
                    f"{combo} on one GPU needs driver branch >= {rule.min_branch} ({rule.note})",
                    rule.min_branch,
                )
            )
    return problems


def cuda_of_driver(release: str) -> str | None:
    """The CUDA version a driver ``release`` (``580.95.05``) supports, as ``nvidia-smi``
    prints it ("CUDA Version: 13.0"): the highest CUDA minor version whose toolkit's minimum
    Linux driver (CUDA release notes, :class:`~catalog.models.CudaDriverRequirement`) the
    release meets; None for a release older than every toolkit the catalog holds, or not a
    release (``R580``)."""
    from .models import CudaDriverRequirement

    try:
        driver = parse_driver_version(release)
    except ValueError:
        return None
    if driver.exact is None:
        return None
    met = [
        cuda
        for cuda, needs in CudaDriverRequirement.objects.values_list(
            "cuda_version", "min_linux_driver"
        )
        if needs and driver.at_least(needs)  # stored as dotted versions (table_rows.py)
    ]
    return max(met, key=version_tuple, default=None)


def newest_known_release(branch: int) -> str | None:
    """The newest release of driver branch ``branch`` (580) that the catalog knows: the
    highest minimum Linux driver of a CUDA release on that branch (``580.95.05`` for R580,
    from CUDA 13.0 Update 2's release notes); None when the catalog names no release of it.
    What a node that asks for a branch runs (the operator installs the branch's current
    release), e.g. on a simulated host."""
    from .models import CudaDriverRequirement

    releases = [
        v
        for v in CudaDriverRequirement.objects.values_list("min_linux_driver", flat=True)
        if v.split(".")[0] == str(branch) and len(v.split(".")) == 3
    ]
    return max(releases, key=version_tuple, default=None)
