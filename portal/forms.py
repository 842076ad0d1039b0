"""Portal forms: labels, widgets and choices for people; validation stays in the API layer.

A form here only turns what a browser posts into the request body the API takes
(:meth:`NodePoolForm.payload` builds ``{"name", "gpu_model", ..., "isolation": {...}}``) and
back. The body is checked by the API's own serializer (:func:`validate_with`) and then by the
same service the API calls; whatever they refuse comes back as an
:class:`~nvke.errors.ApiError` (problem+json ``code`` and ``field``) or DRF validation errors,
which :func:`show_api_error` / :func:`show_validation_errors` put next to the form field the
``field`` names (``isolation.mig_layout.3g.40gb`` -> the "MIG layout" input).
"""

from __future__ import annotations

import re
from typing import Any

from django import forms
from django.contrib.auth import get_user_model
from rest_framework import serializers

from catalog.models import GpuModel, MigProfile, VgpuProfile, XidCode
from fleet.choices import HostState
from nodepools.choices import IsolationMode
from nodepools.host_drivers import DRIVER_PIN_HELP, DRIVER_UPGRADE_HELP
from nvke.errors import ApiError, flatten_validation_errors
from nvke.validation import DATETIME_MAX, DATETIME_MIN, BadValue, to_utc
from portal.listing import quoted
from tenants.choices import Role

XidCodeSeverity = XidCode.Severity

#: form fields whose text must be ASCII: Django's int()/Decimal()/strptime read any Unicode
#: digit (Arabic-Indic 12 as 12, fullwidth 2026 as 2026), which the README promises to refuse
_ASCII_FIELDS = (
    forms.IntegerField,
    forms.DecimalField,
    forms.FloatField,
    forms.DateField,
    forms.DateTimeField,
)
_NOT_ASCII = "use ASCII digits (0-9)"


def _refuse_non_ascii(value: Any) -> None:
    if isinstance(value, str) and not value.isascii():
        raise forms.ValidationError(_NOT_ASCII, code="invalid_number")


class BoundedDateField(forms.DateField):
    """A date between 1970-01-01 and 2199-12-31 (year 1 or 9999 would overflow the window
    arithmetic behind it: ``last + 1 day``), in ASCII digits."""

    def clean(self, value: Any):  # type: ignore[override]
        _refuse_non_ascii(value)
        day = super().clean(value)
        if day is not None and not DATETIME_MIN.date() <= day < DATETIME_MAX.date():
            raise forms.ValidationError(
                "give a date between 1970-01-01 and 2199-12-31", code="datetime_out_of_range"
            )
        return day


class BoundedDateTimeField(forms.DateTimeField):
    """A date and time between 1970-01-01 and 2200-01-01 UTC (:func:`nvke.validation.to_utc`),
    in ASCII digits."""

    def clean(self, value: Any):  # type: ignore[override]
        _refuse_non_ascii(value)
        moment = super().clean(value)
        if moment is not None:
            try:
                to_utc(moment)
            except BadValue as exc:
                raise forms.ValidationError(str(exc), code=exc.code) from exc
        return moment


class ApiForm(forms.Form):
    """A form whose errors may come from the API layer (``field`` + stable ``code``).

    ``api_fields`` maps API field paths (prefixes) to form fields; the longest matching
    prefix wins, anything unmatched becomes a form-wide error. ``api_codes`` keeps the code
    shown beside each error (``{form field or "__all__": code}``).
    """

    api_fields: dict[str, str] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.api_codes: dict[str, str] = {}

    def _clean_fields(self) -> None:
        """Django's cleaning, then numbers and dates given in other than ASCII digits are
        form errors (``invalid_number``)."""
        super()._clean_fields()
        for name, field in self.fields.items():
            if isinstance(field, _ASCII_FIELDS) and name not in self._errors:
                value = self[name].data
                if isinstance(value, str) and not value.isascii():
                    self.add_error(name, forms.ValidationError(_NOT_ASCII, code="invalid_number"))
                    self.api_codes.setdefault(name, "invalid_number")

    def form_field_for(self, api_field: str | None) -> str | None:
        if not api_field:
            return None
        best, best_len = None, -1
        for prefix, name in {**{f: f for f in self.fields}, **self.api_fields}.items():
            if (api_field == prefix or api_field.startswith(prefix + ".")) and len(
                prefix
            ) > best_len:
                best, best_len = name, len(prefix)
        return best

    def add_api_error(self, api_field: str | None, message: str, code: str) -> None:
        name = self.form_field_for(api_field)
        if name is not None and name not in self.fields:
            name = None
        if not hasattr(self, "cleaned_data"):
            self.cleaned_data = {}
        if self._errors is None:
            self._errors = forms.utils.ErrorDict()
        self.add_error(name, forms.ValidationError(message, code=code))
        self.api_codes.setdefault(name or "__all__", code)


def show_api_error(form: ApiForm, exc: ApiError) -> None:
    """Put a service refusal next to the field it names (form-wide when it names none)."""
    field = exc.field
    if field is None and exc.code == "quota_exceeded":
        resource = str(exc.extra.get("resource", ""))
        field = {"clusters": "name", "nodes": "node_count"}.get(
            resource, "node_count" if resource.startswith("gpus.") else None
        )
    message = str(exc.detail)
    valid = exc.extra.get("valid_gpu_models") or exc.extra.get("supported_versions")
    if valid and "valid" not in message and "supported" not in message:
        message += f" (valid: {', '.join(map(str, valid))})"
    form.add_api_error(field, message, exc.code)


def show_validation_errors(form: ApiForm, exc: serializers.ValidationError) -> None:
    """Put the API serializer's field errors next to their fields."""
    for error in flatten_validation_errors(exc.detail):
        code = {"invalid": "invalid_field", "required": "required_field"}.get(
            error["code"], error["code"]
        )
        form.add_api_error(error["field"] or None, error["message"], code)


class OfferedChoiceField(forms.ChoiceField):
    """A select whose choices are offered, not enforced: whatever is posted goes to the API,
    whose answer (e.g. ``unknown_mig_profile`` with the valid ones) is the one shown."""

    def validate(self, value: Any) -> None:
        forms.Field.validate(self, value)


def validate_with(serializer_class: type[serializers.Serializer], data: dict[str, Any]) -> dict:
    """Validate ``data`` with one of the API's serializers; raises its ValidationError."""
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


# ----------------------------------------------------------------------------- tenant portal


class TenantChoiceForm(forms.Form):
    tenant = forms.ChoiceField(label="Tenant")

    def __init__(self, *args: Any, memberships: list, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["tenant"].choices = [
            (str(m.tenant_id), f"{m.tenant.name} ({m.role})") for m in memberships
        ]


class ClusterForm(ApiForm):
    """``POST /api/v1/clusters``: name, Kubernetes version, region (choices from the catalog
    and the fleet, so only supported versions and regions with GPU hosts are offered)."""

    name = forms.CharField(
        label="Name",
        max_length=40,
        required=False,
        help_text="lower-case letters, digits and '-', starting with a letter (DNS-1123 label)",
    )
    kubernetes_version = OfferedChoiceField(label="Kubernetes version", required=False)
    region = OfferedChoiceField(label="Region", required=False)

    def __init__(self, *args: Any, versions: list[str], regions: list[str], **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.fields["kubernetes_version"].choices = [(v, v) for v in versions]
        self.fields["region"].choices = [(r, r) for r in regions]

    def payload(self) -> dict[str, Any]:
        return {k: self.data.get(k, "") for k in ("name", "kubernetes_version", "region")}


LAYOUT_ITEM = re.compile(r"^\s*([0-9a-z.+]+)\s*(?:[=:x*]\s*([0-9]{1,6}))?\s*$", re.I)


def parse_layout(text: str) -> dict[str, int] | None:
    """``"3g.40gb=1, 1g.10gb=2"`` (or ``:``/``x``, or a bare name for 1) -> ``{profile: n}``.

    None when the text is not in that shape; repeated names add up.
    """
    out: dict[str, int] = {}
    for item in filter(None, (p.strip() for p in re.split(r"[,;\n]", text))):
        match = LAYOUT_ITEM.match(item)
        if match is None:
            return None
        count = int(match.group(2) or 1)
        out[match.group(1)] = out.get(match.group(1), 0) + count
    return out or None


ISOLATION_LABELS = {
    IsolationMode.EXCLUSIVE: "exclusive — whole GPUs",
    IsolationMode.MIG: "MIG — hardware partitions (Multi-Instance GPU)",
    IsolationMode.VGPU: "vGPU — NVIDIA virtual GPUs",
    IsolationMode.TIME_SLICING: "time-slicing — processes share each GPU in turn",
    IsolationMode.MPS: "MPS — processes share each GPU at once (Multi-Process Service)",
}


def isolation_modes_for(model: GpuModel | None) -> list[tuple[str, str]]:
    """The isolation modes a GPU model can run: MIG only on MIG-capable models, vGPU only
    where the catalog lists vGPU types (the API refuses the others with
    ``mig_not_supported`` / ``vgpu_not_supported``)."""
    modes = []
    for mode in IsolationMode:
        if mode == IsolationMode.MIG and model is not None and not model.mig_capable:
            continue
        if (
            mode == IsolationMode.VGPU
            and model is not None
            and not VgpuProfile.objects.filter(gpu_model=model).exists()
        ):
            continue
        modes.append((mode.value, ISOLATION_LABELS[mode]))
    return modes


def mig_profile_label(p: MigProfile) -> str:
    memory = f", {p.memory_mib / 1024:.1f} GiB" if p.memory_mib else ""
    return f"{p.name} — {p.compute_slices}/{p.gpu_model.mig_compute_slices or 7} compute{memory}, up to {p.max_instances} per GPU"  # noqa: E501


class NodePoolForm(ApiForm):
    """``POST /api/v1/clusters/{id}/nodepools`` as a form.

    ``gpu_model`` offers the catalog models with hosts in the cluster's region; the isolation
    inputs (``isolation_mode``, ``mig_profile``, ``mig_layout``, ``vgpu_profile``,
    ``replicas``) offer only what the chosen model has (``model`` given to the constructor).
    """

    api_fields = {
        "isolation": "isolation_mode",
        "isolation.mode": "isolation_mode",
        "isolation.tenancy": "isolation_mode",
        "isolation.mig_profile": "mig_profile",
        "isolation.mig_layout": "mig_layout",
        "isolation.vgpu_profile": "vgpu_profile",
        "isolation.vgpu_layout": "vgpu_profile",
        "isolation.replicas": "replicas",
    }

    name = forms.CharField(label="Name", max_length=40, required=False)
    gpu_model = OfferedChoiceField(label="GPU model", required=False)
    gpus_per_node = forms.IntegerField(label="GPUs per node", required=False, min_value=None)
    node_count = forms.IntegerField(label="Nodes", required=False, initial=1)
    isolation_mode = OfferedChoiceField(label="Isolation", required=False)
    mig_profile = OfferedChoiceField(
        label="MIG profile (the same on every GPU)",
        required=False,
        help_text="as many instances of it as fit on each GPU (GPU Operator 'single' strategy)",
    )
    mig_layout = forms.CharField(
        label="or a mixed MIG layout per GPU",
        required=False,
        help_text="profile=count, comma-separated, e.g. 3g.40gb=1, 2g.20gb=1, 1g.10gb=1",
    )
    vgpu_profile = OfferedChoiceField(label="vGPU type", required=False)
    replicas = forms.IntegerField(
        label="Replicas per GPU", required=False, help_text="processes sharing each GPU"
    )
    driver_version = forms.CharField(
        label="Driver (optional)",
        required=False,
        max_length=32,
        help_text=DRIVER_PIN_HELP,
    )
    cuda_version = forms.CharField(
        label="CUDA version the workloads need (optional)", required=False, max_length=16
    )
    reservation = OfferedChoiceField(
        label="Capacity reservation (optional)",
        required=False,
        help_text="draw from one of your reservations: guaranteed placement while it lasts",
    )

    def __init__(
        self,
        *args: Any,
        models: list[tuple[GpuModel, str]],
        model: GpuModel | None,
        reservations: list[tuple[str, str]] = (),  # type: ignore[assignment]
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.model = model
        self.fields["reservation"].choices = [("", "— none (on-demand)"), *reservations]
        self.fields["gpu_model"].choices = [(m.slug, label) for m, label in models]
        self.fields["isolation_mode"].choices = isolation_modes_for(model)
        profiles = (
            list(MigProfile.objects.filter(gpu_model=model).select_related("gpu_model"))
            if model is not None and model.mig_capable
            else []
        )
        self.fields["mig_profile"].choices = [("", "—")] + [
            (p.name, mig_profile_label(p)) for p in profiles
        ]
        self.mig_profiles = profiles
        vgpus = list(VgpuProfile.objects.filter(gpu_model=model)) if model is not None else []
        self.fields["vgpu_profile"].choices = [("", "—")] + [(v.name, v.name) for v in vgpus]

    def clean_isolation_mode(self) -> str:
        return self.cleaned_data.get("isolation_mode") or IsolationMode.EXCLUSIVE

    def isolation(self) -> dict[str, Any] | None:
        """The API's ``isolation`` object, or None after adding a syntax error to the form."""
        data = self.cleaned_data
        mode = data.get("isolation_mode") or IsolationMode.EXCLUSIVE
        iso: dict[str, Any] = {"mode": mode}
        if mode == IsolationMode.MIG:
            if data.get("mig_layout"):
                layout = parse_layout(data["mig_layout"])
                if layout is None:
                    self.add_api_error(
                        "mig_layout",
                        "write the layout as profile=count, comma-separated "
                        "(e.g. 3g.40gb=1, 1g.10gb=2)",
                        "invalid_isolation",
                    )
                    return None
                iso["mig_layout"] = layout
            if data.get("mig_profile"):
                iso["mig_profile"] = data["mig_profile"]
        elif mode == IsolationMode.VGPU:
            if data.get("vgpu_profile"):
                iso["vgpu_profile"] = data["vgpu_profile"]
        elif mode in (IsolationMode.TIME_SLICING, IsolationMode.MPS):
            if data.get("replicas") is not None:
                iso["replicas"] = data["replicas"]
            if mode == IsolationMode.TIME_SLICING and data.get("mig_profile"):
                iso["mig_profile"] = data["mig_profile"]
        return iso

    def payload(self) -> dict[str, Any] | None:
        """The API request body, or None when the form itself found a syntax error."""
        isolation = self.isolation()
        if isolation is None:
            return None
        data = self.cleaned_data
        body: dict[str, Any] = {
            "name": data.get("name", ""),
            "gpu_model": data.get("gpu_model", ""),
            "isolation": isolation,
            "driver_version": data.get("driver_version", ""),
            "cuda_version": data.get("cuda_version", ""),
        }
        for key in ("gpus_per_node", "node_count"):
            body[key] = data.get(key)
        if data.get("reservation"):
            body["reservation"] = data["reservation"]
        return {k: v for k, v in body.items() if v is not None}


class IsolationForm(NodePoolForm):
    """``PATCH .../nodepools/{id}`` ``{"isolation": {...}}``: the isolation inputs only."""

    def __init__(self, *args: Any, model: GpuModel, **kwargs: Any) -> None:
        super().__init__(*args, models=[(model, model.name)], model=model, **kwargs)
        for name in (
            "name",
            "gpu_model",
            "gpus_per_node",
            "node_count",
            "driver_version",
            "cuda_version",
            "reservation",
        ):
            del self.fields[name]


class UpgradeForm(ApiForm):
    """``PATCH /api/v1/clusters/{id}`` ``{"kubernetes_version"}``: a control plane upgrade,
    offering the versions the skew policy allows next (one minor at a time)."""

    kubernetes_version = OfferedChoiceField(label="Upgrade the control plane to", required=False)

    def __init__(self, *args: Any, versions: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["kubernetes_version"].choices = [(v, v) for v in versions]


class NodeUpgradeForm(ApiForm):
    """``POST …/nodepools/{id}/upgrade``: the nodes' Kubernetes version and/or NVIDIA driver,
    rolled node by node (versions offered: from the pool's up to the control plane's)."""

    kubernetes_version = OfferedChoiceField(label="Kubernetes version of the nodes", required=False)
    driver_version = forms.CharField(
        label="NVIDIA driver (optional)",
        required=False,
        max_length=32,
        help_text=DRIVER_UPGRADE_HELP,
    )
    max_surge = forms.IntegerField(
        label="Extra nodes during the rollout (max surge)", required=False, initial=0
    )
    max_unavailable = forms.IntegerField(
        label="Nodes upgraded at once (max unavailable)", required=False, initial=1
    )
    urgent = forms.BooleanField(
        label="Urgent: do not wait for the maintenance window", required=False
    )

    def __init__(self, *args: Any, versions: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["kubernetes_version"].choices = [(v, v) for v in versions]

    def payload(self) -> dict[str, Any]:
        data = self.cleaned_data
        body: dict[str, Any] = {"urgent": bool(data.get("urgent"))}
        if data.get("kubernetes_version"):
            body["kubernetes_version"] = data["kubernetes_version"]
        if data.get("driver_version"):
            body["driver_version"] = data["driver_version"]
        for key in ("max_surge", "max_unavailable"):
            if data.get(key) is not None:
                body[key] = data[key]
        return body


class ScaleForm(ApiForm):
    """``POST .../set-size`` ``{"node_count": n}``."""

    node_count = forms.IntegerField(label="Nodes", required=False)


class ApiKeyForm(ApiForm):
    """``POST /api/v1/tenants/{id}/api-keys``: name, role, optional expiry."""

    name = forms.CharField(label="Name", max_length=50, required=False)
    role = forms.ChoiceField(label="Role", choices=Role.choices, initial=Role.MEMBER)
    expiry_date = BoundedDateTimeField(
        label="Expires (optional, UTC)",
        required=False,
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
    )


def check_password(form: forms.Form, field: str, username: str, email: str) -> None:
    """Django's ``AUTH_PASSWORD_VALIDATORS`` on a password a form sets (blank: not set)."""
    from django.contrib.auth.password_validation import validate_password

    password = form.cleaned_data.get(field)
    if not password:
        return
    try:
        validate_password(password, user=get_user_model()(username=username, email=email))
    except forms.ValidationError as exc:
        form.add_error(field, exc)


class RoleForm(forms.Form):
    role = forms.ChoiceField(label="Role", choices=Role.choices)


class AuditFilterForm(forms.Form):
    actor = forms.CharField(label="Actor", required=False)
    action = forms.CharField(
        label="Action",
        required=False,
        widget=forms.TextInput(attrs={"list": "audit-actions"}),
        help_text="e.g. cluster.create, nodepool.set_size, apikey.create",
    )
    target_type = forms.CharField(label="Target type", required=False)
    since = BoundedDateField(
        label="Since (UTC)", required=False, widget=forms.DateInput(attrs={"type": "date"})
    )
    until = BoundedDateField(
        label="Until (UTC, exclusive)",
        required=False,
        widget=forms.DateInput(attrs={"type": "date"}),
    )


class WindowForm(forms.Form):
    """A reporting window in whole days of the tenant's billing ``time_zone`` (UTC for
    operators): ``start`` inclusive, ``end`` inclusive."""

    start = BoundedDateField(
        label="From (UTC)", required=False, widget=forms.DateInput(attrs={"type": "date"})
    )
    end = BoundedDateField(
        label="To (UTC, inclusive)", required=False, widget=forms.DateInput(attrs={"type": "date"})
    )

    def __init__(self, *args, time_zone: str = "UTC", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["start"].label = f"From ({time_zone})"
        self.fields["end"].label = f"To ({time_zone}, inclusive)"


# ----------------------------------------------------------------------------- console


class CordonForm(ApiForm):
    reason = forms.CharField(label="Reason (optional)", required=False, max_length=200)


class DrainForm(ApiForm):
    target = forms.ChoiceField(
        label="Then enter",
        choices=[(s, s) for s in (HostState.CORDONED, HostState.MAINTENANCE, HostState.RETIRED)],
    )
    force = forms.BooleanField(
        label="Force (evict pods that block a drain)", required=False, initial=False
    )


class ConfirmNameForm(ApiForm):
    """The typed-name confirmation of a disruptive host action (drain, maintenance, retire):
    the operator types the host's name; checked on the server against ``Host.hostname``."""

    confirm_name = forms.CharField(label="Type the host's name to confirm", max_length=253)

    def __init__(self, *args: Any, expected: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.expected = expected

    def clean_confirm_name(self) -> str:
        typed = self.cleaned_data["confirm_name"].strip()
        if typed != self.expected:
            raise forms.ValidationError(
                f"type {self.expected} exactly to confirm", code="confirmation_mismatch"
            )
        return typed


class XidFilterForm(ApiForm):
    """Filters of the Xid events page; choices come from the stored events and the catalog's
    Xid table (``catalog.XidCode``): host, GPU (NVML UUID), Xid code, NVIDIA's immediate
    action, NVKE's severity, a time range (UTC), and the page (1 … :data:`MAX_PAGE`)."""

    MAX_PAGE = 1000

    host = forms.ChoiceField(label="Host", required=False)
    gpu = forms.CharField(label="GPU (UUID)", required=False, max_length=64)
    xid = forms.ChoiceField(label="Xid", required=False)
    action = forms.ChoiceField(label="Action (catalog)", required=False)
    severity = forms.ChoiceField(label="Severity (catalog)", required=False)
    since = BoundedDateTimeField(
        label="From (UTC)",
        required=False,
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
    )
    until = BoundedDateTimeField(
        label="To (UTC)",
        required=False,
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
    )
    page = forms.IntegerField(
        label="Page", required=False, min_value=1, max_value=MAX_PAGE, widget=forms.HiddenInput
    )

    def __init__(
        self,
        *args: Any,
        hosts: list[tuple[str, str]],
        codes: list[tuple[int, str]],
        actions: list[str],
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.fields["host"].choices = [("", "any"), *hosts]
        self.fields["xid"].choices = [("", "any"), *((str(c), label) for c, label in codes)]
        self.fields["action"].choices = [("", "any"), *((a, a) for a in actions)]
        self.fields["severity"].choices = [("", "any"), *XidCodeSeverity.choices]

    def clean(self) -> dict[str, Any]:
        """``until`` after ``since``; a query parameter that is no filter of this page (a
        typo such as ``?hots=``) is a form-wide error, never silently ignored."""
        data = super().clean()
        since, until = data.get("since"), data.get("until")
        if since and until and until <= since:
            self.add_error("until", forms.ValidationError("must be after From", code="invalid"))
        unknown = sorted(set(self.data) - set(self.fields))
        if unknown:
            names = ", ".join(quoted(name) for name in unknown[:5])
            self.add_error(
                None,
                forms.ValidationError(
                    f"not a filter of this page: {names}; the filters are "
                    + ", ".join(self.fields),
                    code="unknown_filter",
                ),
            )
        return data

    def refuse_page(self, num_pages: int) -> None:
        """A ``page`` past the last of the filtered events is an error of the page field."""
        number = self.cleaned_data.get("page") if hasattr(self, "cleaned_data") else None
        if number and number > max(num_pages, 1):
            last = max(num_pages, 1)
            self.add_error(
                "page",
                forms.ValidationError(
                    f"page {number} does not exist: these filters give {last} "
                    f"page{'s' if last != 1 else ''}",
                    code="invalid",
                ),
            )


class HostFilterForm(forms.Form):
    state = forms.ChoiceField(
        label="State", required=False, choices=[("", "any"), *HostState.choices]
    )
    zone = forms.CharField(label="Zone", required=False)
    gpu_model = forms.CharField(label="GPU model (slug)", required=False)


class TenantCreateForm(ApiForm):
    """A tenant and its first owner (a login for the portal)."""

    name = forms.CharField(label="Tenant name", max_length=100, required=False)
    owner_username = forms.CharField(label="Owner username", max_length=150, required=False)
    owner_email = forms.EmailField(label="Owner email", required=False)
    owner_password = forms.CharField(
        label="Owner's initial password",
        required=False,
        widget=forms.PasswordInput(render_value=False),
    )
    api_fields = {"username": "owner_username", "email": "owner_email"}

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        for field in ("name", "owner_username", "owner_password"):
            if not data.get(field):
                self.add_error(field, "required")
        check_password(
            self, "owner_password", data.get("owner_username") or "", data.get("owner_email") or ""
        )
        username = data.get("owner_username")
        if username and get_user_model().objects.filter(username__iexact=username).exists():
            self.add_error(
                "owner_username",
                "a user of this name (in any letter case) exists already: choose another name,"
                " or add them as a member instead",
            )
        return data


class QuotaForm(ApiForm):
    """``PUT /api/v1/quotas/{tenant}``: limits; GPUs per model as ``slug=count`` lines."""

    max_clusters = forms.IntegerField(label="Max clusters", min_value=0)
    max_nodes = forms.IntegerField(label="Max nodes", min_value=0)
    max_gpus = forms.CharField(
        label="Max GPUs per model",
        required=False,
        widget=forms.Textarea(attrs={"rows": 4}),
        help_text="one slug=count per line, e.g. h100-sxm5-80gb=64; models not listed get the default",  # noqa: E501
    )

    def clean_max_gpus(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for line in self.cleaned_data.get("max_gpus", "").splitlines():
            if not line.strip():
                continue
            slug, sep, count = line.partition("=")
            count = count.strip()
            if not sep or not (count.isascii() and count.isdigit()) or len(count) > 9:
                raise forms.ValidationError(f"{line.strip()!r} is not slug=count")
            out[slug.strip()] = int(count)
        return out

    #: asked (and shown) only when a new limit is below the tenant's current use
    #: (:func:`tenants.quotas.limits_below_use`)
    confirm_below_use = forms.BooleanField(
        label="Set these limits although they are below current use (running clusters and "
        "nodes stay; new growth is refused)",
        required=False,
    )


class AmountField(forms.DecimalField):
    """A money amount or percentage typed by a person: ASCII digits, one ``.``, an optional
    sign (Arabic-Indic or fullwidth digits would parse in Python's Decimal: refused, since
    nobody types them meaning a price), finite and within ``max_digits`` (so ``1e400`` is a
    form error, not an overflow). The range (``[0, 99999999]`` …) is the service's rule
    (:func:`billing.prices.set_price`), shown next to the field."""

    #: no exponent: "1e3" published 1000 per GPU-hour (found by a new-user trial)
    ASCII_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)$", re.ASCII)

    def to_python(self, value: Any):
        text = str(value).strip() if value is not None else ""
        if text and not self.ASCII_NUMBER.match(text):
            raise forms.ValidationError(
                "type a number with the digits 0-9 and a '.' (for example 2.50)",
                code="invalid_number",
            )
        return super().to_python(text)


class PriceForm(ApiForm):
    """A price version (:func:`billing.prices.set_price`).

    Rates are :class:`AmountField` s listed in :attr:`rate_fields` (form field -> keyword of
    ``set_price``); a new rate kind (a reservation rate, say) is one more field and entry.
    A price sheet has one currency (:func:`billing.prices.sheet_currencies`): another needs
    ``new_currency`` ticked, checked by the service.
    """

    #: form field -> set_price keyword, for every rate-like field
    rate_fields: dict[str, str] = {
        "hourly_rate": "hourly_rate",
        "discount_pct": "discount_pct",
        "reservation_hourly_rate": "reservation_hourly_rate",
    }

    gpu_model = forms.ModelChoiceField(
        label="GPU model", queryset=GpuModel.objects.order_by("slug"), to_field_name="slug"
    )
    mig_profile = forms.CharField(
        label="MIG profile (blank: whole GPU)", required=False, max_length=32
    )
    hourly_rate = AmountField(
        label="Hourly rate per GPU-hour", required=False, max_digits=14, decimal_places=6
    )
    discount_pct = AmountField(
        label="or discount % off list (tenant override only)",
        required=False,
        max_digits=5,
        decimal_places=2,
    )
    reservation_hourly_rate = AmountField(
        label="Reservation rate per reserved GPU-hour (blank: none)",
        required=False,
        max_digits=14,
        decimal_places=6,
    )
    currency = forms.CharField(label="Currency (ISO 4217)", max_length=3, initial="USD")
    new_currency = forms.BooleanField(
        label="a currency this price sheet does not use yet (a second sheet currency)",
        required=False,
    )
    effective_from = BoundedDateTimeField(
        label="Effective from (UTC)", widget=forms.DateTimeInput(attrs={"type": "datetime-local"})
    )
    tenant = forms.ChoiceField(label="Tenant (blank: list price)", required=False)
    label = forms.CharField(label="Label", required=False, max_length=100)

    def __init__(self, *args: Any, tenants: list, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["tenant"].choices = [("", "— list price —")] + [
            (str(t.pk), t.name) for t in tenants
        ]

    def clean_currency(self) -> str:
        code = self.cleaned_data["currency"].strip().upper()
        if not re.fullmatch(r"[A-Z]{3}", code, re.ASCII):
            raise forms.ValidationError("three letters A-Z, like USD", code="unknown_currency")
        return code

    def payload(self, tenant) -> dict[str, Any]:
        """Keyword arguments of :func:`billing.prices.set_price` from the cleaned data."""
        data = self.cleaned_data
        return {
            "gpu_model": data["gpu_model"].slug,
            "mig_profile": data["mig_profile"],
            "currency": data["currency"],
            "new_currency": data["new_currency"],
            "effective_from": data["effective_from"],
            "tenant": tenant,
            "label": data["label"],
            **{kw: data.get(name) for name, kw in self.rate_fields.items()},
        }
