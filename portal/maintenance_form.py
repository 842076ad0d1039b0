"""The cluster page's maintenance policy form: the policy as JSON text, checked by the API's
serializer and ``clusters.maintenance.validate_policy`` (through ``update_cluster``), whose
refusal names the field (``maintenance_policy.windows[0].start``) shown next to the text."""

from __future__ import annotations

import json
from typing import Any

from django import forms

from portal.forms import ApiForm

#: the most text a policy may take (32 windows and 64 exclusions fit in far less)
MAX_POLICY_CHARS = 20_000

EXAMPLE = {
    "time_zone": "Europe/Berlin",
    "windows": [{"days": ["sat", "sun"], "start": "02:00", "end": "06:00"}],
    "exclusions": [],
}


class MaintenancePolicyForm(ApiForm):
    """``policy``: a JSON object, or empty text for "any time" (``{}``)."""

    api_fields = {"maintenance_policy": "policy"}

    policy = forms.CharField(
        label="Maintenance policy (JSON)",
        required=False,
        max_length=MAX_POLICY_CHARS,
        widget=forms.Textarea(attrs={"rows": 8, "class": "wide mono", "spellcheck": "false"}),
        help_text=(
            'Windows are local times in the IANA zone: {"time_zone": "Europe/Berlin", "windows": '
            '[{"days": ["sat"], "start": "02:00", "end": "06:00"}]}. Empty: any time.'
        ),
    )

    def clean_policy(self) -> dict[str, Any]:
        text = (self.cleaned_data.get("policy") or "").strip()
        if not text:
            return {}
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(
                f"not JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})", code="invalid_json"
            ) from exc
        if not isinstance(value, dict):
            raise forms.ValidationError("give a JSON object", code="invalid_maintenance_policy")
        return value


def policy_text(policy: dict[str, Any]) -> str:
    """A stored policy as the form's text (indented JSON; empty for none)."""
    return json.dumps(policy, indent=2) if policy else ""
