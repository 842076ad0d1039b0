"""Operator console: health rules and the circuit breaker — the rules in effect (catalog
defaults and overrides), a form to override one (validated by the API's serializer: the same
bounds, the same words), a button to restore a default, the dry run over the stored Xid
events, and the open circuit breakers (why automation waits) with a button to resume. The
page calls the services the API calls (:mod:`fleet.health_rules`, :mod:`fleet.breaker`); no
logic here."""

from __future__ import annotations

from django import forms
from django.conf import settings
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from fleet import breaker, health_rules
from fleet.api.health_rules import HealthRuleFieldsSerializer
from fleet.breaker_models import BreakerTrip
from fleet.choices import LADDER_ORDER, LadderStep
from nvke.errors import NotFound
from portal.access import console_page


class HealthRuleForm(forms.Form):
    """An override of one rule; :meth:`clean` asks the API's serializer."""

    key = forms.CharField(label="Rule key", max_length=32, help_text="xid-31, ecc-dbe …")
    threshold_count = forms.IntegerField(label="Occurrences", initial=1)
    window_s = forms.IntegerField(label="Within (s, 0 = no window)", initial=0)
    condition = forms.CharField(label="Condition", max_length=64)
    ladder = forms.MultipleChoiceField(
        label="Action ladder (mildest first)",
        choices=LadderStep.choices,
        widget=forms.CheckboxSelectMultiple,
    )
    escalation_window_s = forms.IntegerField(label="Escalate if it recurs within (s)")
    needs_operator = forms.BooleanField(label="Counts for SLA credits", required=False)
    enabled = forms.BooleanField(label="Enabled", required=False, initial=True)

    def clean_key(self) -> str:
        key = self.cleaned_data["key"]
        try:
            signal, _ = health_rules.parse_key(key)
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from exc
        if signal in health_rules.UNWIRED_SIGNALS:  # the API's 400: no rule that does nothing
            raise forms.ValidationError(str(health_rules.UnwiredSignal(signal)))
        return key

    def clean(self):
        data = super().clean()
        fields = {k: v for k, v in data.items() if k != "key"}
        if "ladder" in fields:  # checkboxes come in form order, which is the ladder's order
            fields["ladder"] = sorted(fields["ladder"], key=LADDER_ORDER.index)
        api = HealthRuleFieldsSerializer(data=fields)
        if not api.is_valid():
            for name, errors in api.errors.items():
                self.add_error(name if name in self.fields else None, [str(e) for e in errors])
        else:
            data.update(api.validated_data)
        return data


def _page(request, form: HealthRuleForm, status: int = 200) -> HttpResponse:
    dry = None
    days = request.GET.get("dry_run_days")
    if days:
        try:
            dry = {
                "days": int(days),
                "firings": health_rules.dry_run(
                    health_rules.effective_rules(), days=int(days), now=timezone.now()
                ),
            }
        except ValueError:
            dry = {"error": f"days must be a whole number 1..{health_rules.MAX_DRY_RUN_DAYS}"}
            status = 400
    return render(
        request,
        "portal/console/health_rules.html",
        {
            "rules": list(health_rules.effective_rules().values()),
            "form": form,
            "dry": dry,
            "max_days": health_rules.MAX_DRY_RUN_DAYS,
            "trips": list(BreakerTrip.objects.filter(resumed_at__isnull=True)),
            "share": settings.NVKE_BREAKER_SHARE,
            "window_s": settings.NVKE_BREAKER_WINDOW_S,
        },
        status=status,
    )


@console_page
def health_rules_page(request: HttpRequest) -> HttpResponse:
    """The rules in effect; ``?edit=<key>`` fills the form with that rule; ``?dry_run_days=N``
    shows what the rules in effect would have done over the last N days."""
    initial = {"escalation_window_s": health_rules.escalation_window_s(), "needs_operator": True}
    rule = health_rules.effective_rules().get(request.GET.get("edit", ""))
    if rule is not None:
        initial = {**rule.as_dict(), "ladder": list(rule.ladder)}
    return _page(request, HealthRuleForm(initial=initial))


@require_POST
@console_page
def health_rule_save(request: HttpRequest) -> HttpResponse:
    """Store the override (versioned, audited as the operator); refusals beside the fields."""
    form = HealthRuleForm(request.POST)
    if not form.is_valid():
        return _page(request, form, status=400)
    values = {k: v for k, v in form.cleaned_data.items() if k != "key"}
    rule = health_rules.save_rule(form.cleaned_data["key"], values, actor=request.principal.label)
    messages.success(request, f"Saved rule {rule.key} (version {rule.version}).")
    return redirect("console:health-rules")


@require_POST
@console_page
def health_rule_restore(request: HttpRequest, key: str) -> HttpResponse:
    """Remove the override: the catalog default applies again."""
    try:
        health_rules.delete_rule(key, actor=request.principal.label)
    except (LookupError, ValueError) as exc:
        raise NotFound() from exc
    messages.success(request, f"Rule {key}: the catalog default applies again.")
    return redirect("console:health-rules")


@require_POST
@console_page
def breaker_resume(request: HttpRequest, scope: str) -> HttpResponse:
    """The operator resumes automation in ``scope`` (audited)."""
    if breaker.resume(scope, actor=request.principal.label, now=timezone.now()) is None:
        raise NotFound()
    messages.success(request, f"Automation resumed for {scope}.")
    return redirect("console:health-rules")
