"""Health rules as data: the operator's overrides of the catalog's Xid mapping, and the
record of every time a rule fired (what escalation and the console read).

The rules in effect are the catalog's defaults (:func:`fleet.health_rules.default_rules`,
one per critical Xid) with these rows laid over them: a row replaces the default of its
signal (and Xid), a disabled row switches it off, deleting the row restores the default.
Every change bumps ``version`` and writes an audit event (who, before/after): see
:mod:`fleet.health_rules`.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from .choices import HealthSignal, LadderStep


class HealthRule(models.Model):
    """One rule: ``signal`` (and ``xid`` for an Xid rule) seen ``threshold_count`` times
    within ``window_s`` seconds (0: no window, every occurrence since the rule last fired
    counts) on one GPU sets ``condition`` and takes the first step of ``ladder`` (a list of
    :class:`~fleet.choices.LadderStep`, mildest first); firing again within
    ``escalation_window_s`` of its last firing on that GPU takes the next step.
    ``needs_operator``: the unhealthy time it opens counts for SLA credits."""

    signal = models.CharField(max_length=24, choices=HealthSignal.choices)
    xid = models.PositiveIntegerField(null=True, blank=True)
    threshold_count = models.PositiveIntegerField(default=1)
    window_s = models.PositiveIntegerField(default=0)
    condition = models.CharField(max_length=64)
    ladder = models.JSONField(default=list)
    escalation_window_s = models.PositiveIntegerField()
    needs_operator = models.BooleanField(default=True)
    enabled = models.BooleanField(default=True)
    version = models.PositiveIntegerField(default=1)
    updated_by = models.CharField(max_length=100, blank=True)
    updated_at = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["signal", "xid"]
        constraints = [
            models.UniqueConstraint(
                fields=["signal", "xid"], nulls_distinct=False, name="healthrule_one_per_signal"
            ),
            models.CheckConstraint(
                condition=(Q(signal=HealthSignal.XID) & Q(xid__isnull=False))
                | (~Q(signal=HealthSignal.XID) & Q(xid__isnull=True)),
                name="healthrule_xid_iff_xid_signal",
            ),
        ]

    def __str__(self) -> str:
        return self.key

    @property
    def key(self) -> str:
        from .health_rules import key_of

        return key_of(self.signal, self.xid)


class HealthRuleFiring(models.Model):
    """A rule fired on a GPU at ``fired_at`` (the time of the event that reached the
    threshold) with ``count`` events counted, taking ladder step ``step`` (0-based) whose
    action is ``action``. ``rule_version`` is the rule's version then (0: catalog default)."""

    rule_key = models.CharField(max_length=32)
    rule_version = models.PositiveIntegerField(default=0)
    gpu_uuid = models.CharField(max_length=64)
    host = models.ForeignKey("fleet.Host", on_delete=models.CASCADE, related_name="+")
    fired_at = models.DateTimeField()
    xid = models.PositiveIntegerField(null=True, blank=True)
    count = models.PositiveIntegerField()
    step = models.PositiveSmallIntegerField()
    action = models.CharField(max_length=24, choices=LadderStep.choices)

    class Meta:
        ordering = ["fired_at"]
        indexes = [models.Index(fields=["rule_key", "gpu_uuid", "fired_at"])]

    def __str__(self) -> str:
        return f"{self.rule_key} on {self.gpu_uuid} at {self.fired_at}: {self.action}"
