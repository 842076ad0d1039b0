"""Health rules API (operators only): the rules in effect, an override per rule key, and the
dry run. Thin: validate, call :mod:`fleet.health_rules`, serialize.

``GET /fleet/health-rules`` the rules in effect (catalog defaults and overrides);
``GET|PUT|DELETE /fleet/health-rules/{key}`` one rule (``xid-31``, ``ecc-dbe`` …): PUT stores
an override (versioned, audited), DELETE restores the catalog default;
``POST /fleet/health-rules/dry-run`` ``{"days": 1..90, "rules": [{"key", …fields}]}``: what
the rules in effect, with ``rules`` laid over them unsaved, would have done over the stored
Xid events, GPU samples and logged flag / NVML-init occurrences of the last ``days`` days.
A rule on a signal NVKE does not evaluate (:data:`fleet.health_rules.UNWIRED_SIGNALS`: none
today, every signal is wired) is refused: 400, field ``signal`` (PUT) or ``rules[i].key``
(dry run);
``GET /fleet/breakers`` the open circuit breakers, ``POST /fleet/breakers/{scope}/resume``
resumes automation there (:mod:`fleet.breaker`).
"""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from fleet import breaker, health_rules
from fleet.breaker_models import BreakerTrip
from fleet.choices import LADDER_ORDER, LadderStep
from nvke.errors import InvalidInput, NotFound, refuse_unknown_fields
from tenants.permissions import IsOperator

#: at most this many unsaved rules in one dry run
MAX_DRY_RUN_RULES = 50


class HealthRuleFieldsSerializer(serializers.Serializer):
    """What an operator sets on a rule; bounded (see :mod:`fleet.health_rules`)."""

    threshold_count = serializers.IntegerField(min_value=1, max_value=health_rules.MAX_THRESHOLD)
    window_s = serializers.IntegerField(min_value=0, max_value=health_rules.MAX_WINDOW_S)
    condition = serializers.RegexField(
        r"^[A-Z][A-Za-z0-9]*$",
        max_length=64,
        error_messages={"invalid": "a condition type in CamelCase, e.g. GpuMemoryFaults"},
    )
    ladder = serializers.ListField(
        child=serializers.ChoiceField(choices=LadderStep.choices),
        min_length=1,
        max_length=len(LADDER_ORDER),
    )
    escalation_window_s = serializers.IntegerField(min_value=0, max_value=health_rules.MAX_WINDOW_S)
    needs_operator = serializers.BooleanField(default=True)
    enabled = serializers.BooleanField(default=True)

    def validate_ladder(self, value: list[str]) -> list[str]:
        ranks = [LADDER_ORDER.index(step) for step in value]
        if ranks != sorted(set(ranks)):
            raise serializers.ValidationError(
                f"steps escalate, each once, in this order: {', '.join(LADDER_ORDER)}"
            )
        return value


class HealthRuleSerializer(HealthRuleFieldsSerializer):
    """A rule in effect, as the API shows it."""

    key = serializers.CharField()
    signal = serializers.CharField()
    xid = serializers.IntegerField(allow_null=True)
    source = serializers.CharField(help_text="catalog (a default) or operator (an override)")
    version = serializers.IntegerField(help_text="0 for a catalog default")
    nvidia_action = serializers.CharField()
    updated_by = serializers.CharField()
    updated_at = serializers.DateTimeField(allow_null=True)


class DryRunRuleSerializer(HealthRuleFieldsSerializer):
    key = serializers.CharField(max_length=32)


class DryRunSerializer(serializers.Serializer):
    days = serializers.IntegerField(min_value=1, max_value=health_rules.MAX_DRY_RUN_DAYS)
    rules = serializers.ListField(
        child=DryRunRuleSerializer(), required=False, default=list, max_length=MAX_DRY_RUN_RULES
    )


class FiringSerializer(serializers.Serializer):
    rule_key = serializers.CharField()
    rule_version = serializers.IntegerField()
    gpu_uuid = serializers.CharField()
    host_id = serializers.CharField()
    fired_at = serializers.DateTimeField()
    xid = serializers.IntegerField(allow_null=True)
    count = serializers.IntegerField()
    step = serializers.IntegerField()
    action = serializers.CharField()


class DryRunResultSerializer(serializers.Serializer):
    days = serializers.IntegerField()
    since = serializers.DateTimeField()
    until = serializers.DateTimeField()
    actions = serializers.DictField(child=serializers.IntegerField())
    firings = FiringSerializer(many=True)


class HealthRuleListSerializer(serializers.Serializer):
    count = serializers.IntegerField()
    results = HealthRuleSerializer(many=True)


def _actor(request) -> str:
    return getattr(request.user, "label", "") or "operator"


def _key(key: str) -> str:
    try:
        health_rules.parse_key(key)
    except ValueError as exc:
        raise NotFound(str(exc)) from exc
    return key


class HealthRuleListView(APIView):
    """GET: the health rules in effect (catalog defaults and operator overrides)."""

    permission_classes = [IsOperator]

    @extend_schema(
        operation_id="fleet_health_rules_list", responses={200: HealthRuleListSerializer}
    )
    def get(self, request):
        rules = [r.as_dict() for r in health_rules.effective_rules().values()]
        return Response({"count": len(rules), "results": rules})


class HealthRuleDetailView(APIView):
    """One health rule by key: GET, PUT (store an override), DELETE (back to the default)."""

    permission_classes = [IsOperator]

    @extend_schema(responses={200: HealthRuleSerializer})
    def get(self, request, key: str):
        rule = health_rules.effective_rules().get(_key(key))
        if rule is None:
            raise NotFound()
        return Response(rule.as_dict())

    @extend_schema(request=HealthRuleFieldsSerializer, responses={200: HealthRuleSerializer})
    def put(self, request, key: str):
        key = _key(key)
        refuse_unknown_fields(
            request.data, HealthRuleFieldsSerializer().fields, "a rule takes its settings"
        )
        form = HealthRuleFieldsSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        try:
            rule = health_rules.save_rule(key, form.validated_data, actor=_actor(request))
        except health_rules.UnwiredSignal as exc:
            raise InvalidInput(str(exc), code="unwired_signal", field="signal") from exc
        return Response(rule.as_dict())

    @extend_schema(responses={200: HealthRuleSerializer, 204: None})
    def delete(self, request, key: str):
        try:
            rule = health_rules.delete_rule(_key(key), actor=_actor(request))
        except LookupError as exc:
            raise NotFound("No override stored for this rule.") from exc
        if rule is None:
            return Response(status=204)
        return Response(rule.as_dict())


class HealthRuleDryRunView(APIView):
    """POST: what the rules (with unsaved ``rules`` laid over them) would have done."""

    permission_classes = [IsOperator]

    @extend_schema(request=DryRunSerializer, responses={200: DryRunResultSerializer})
    def post(self, request):
        form = DryRunSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        overrides = []
        for i, raw in enumerate(form.validated_data["rules"]):
            values = dict(raw)
            try:
                signal, xid = health_rules.parse_key(values.pop("key"))
            except ValueError as exc:
                raise InvalidInput(str(exc), code="unknown_rule", field=f"rules[{i}].key") from exc
            if signal in health_rules.UNWIRED_SIGNALS:
                raise InvalidInput(
                    str(health_rules.UnwiredSignal(signal)),
                    code="unwired_signal",
                    field=f"rules[{i}].key",
                )
            row = health_rules.HealthRule(signal=signal, xid=xid, version=0, **values)
            overrides.append(health_rules.rule_from_row(row))
        rules = health_rules.with_overrides(health_rules.effective_rules(), overrides)
        now, days = timezone.now(), form.validated_data["days"]
        firings = health_rules.dry_run(rules, days=days, now=now)
        actions: dict[str, int] = {}
        for f in firings:
            actions[f.action] = actions.get(f.action, 0) + 1
        return Response(
            {
                "days": days,
                "since": now - timedelta(days=days),
                "until": now,
                "actions": actions,
                "firings": [f.as_dict() for f in firings],
            }
        )


class BreakerTripSerializer(serializers.Serializer):
    scope = serializers.CharField(help_text="pool:<uuid> or model:<gpu model slug>")
    tripped_at = serializers.DateTimeField()
    reason = serializers.CharField()
    resumed_at = serializers.DateTimeField(allow_null=True)
    resumed_by = serializers.CharField()


class BreakerListView(APIView):
    """GET: the open circuit breakers (where automation waits, and why)."""

    permission_classes = [IsOperator]

    @extend_schema(responses={200: BreakerTripSerializer(many=True)})
    def get(self, request):
        trips = BreakerTrip.objects.filter(resumed_at__isnull=True)
        return Response(BreakerTripSerializer(trips, many=True).data)


class BreakerResumeView(APIView):
    """POST: resume automation in a scope whose breaker is open (audited)."""

    permission_classes = [IsOperator]

    @extend_schema(request=None, responses={200: BreakerTripSerializer})
    def post(self, request, scope: str):
        trip = breaker.resume(scope[:80], actor=_actor(request), now=timezone.now())
        if trip is None:
            raise NotFound("No open circuit breaker for this scope.")
        return Response(BreakerTripSerializer(trip).data)
