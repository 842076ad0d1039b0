"""Node's parallel sub-states (``config_state``, ``upgrade_state``, ``repair_state``,
``move_state``) become one: ``disruption`` (why) + ``disruption_step`` (how far). This
migration adds the two fields and maps every row; 0016 drops the old columns and derives them
from the new ones.

Forward, a row with more than one old sub-state keeps the one that wins under the model's
overlap rule (``Node`` docstring): repair, then move, then isolation change, then upgrade.
Backward, the step goes back to the field of its disruption (``scale-down`` and ``deletion``
had none: their nodes were DRAINING with no sub-state)."""

from django.db import migrations, models

#: (disruption, old field), in the order the overlap rule ranks them
OLD_FIELDS = (
    ("repair", "repair_state"),
    ("move", "move_state"),
    ("isolation-change", "config_state"),
    ("upgrade", "upgrade_state"),
)


def forward_values(row: dict) -> tuple[str, str]:
    """``(disruption, disruption_step)`` of a row of the old fields."""
    for disruption, field in OLD_FIELDS:
        if row.get(field):
            return disruption, row[field]
    return "", ""


def backward_values(disruption: str, step: str) -> dict:
    """The old fields of a row of the new ones."""
    values = {field: "" for _, field in OLD_FIELDS}
    for kind, field in OLD_FIELDS:
        if kind == disruption:
            values[field] = step
    return values


def forward(apps, schema_editor):
    Node = apps.get_model("nodepools", "Node")
    old = [field for _, field in OLD_FIELDS]
    changed = []
    for node in Node.objects.filter(
        models.Q(repair_state__gt="")
        | models.Q(move_state__gt="")
        | models.Q(config_state__gt="")
        | models.Q(upgrade_state__gt="")
    ).only("pk", *old):
        node.disruption, node.disruption_step = forward_values(
            {f: getattr(node, f) for f in old}
        )
        changed.append(node)
    Node.objects.bulk_update(changed, ["disruption", "disruption_step"], batch_size=500)


def backward(apps, schema_editor):
    Node = apps.get_model("nodepools", "Node")
    changed = []
    for node in Node.objects.exclude(disruption="").only("pk", "disruption", "disruption_step"):
        for field, value in backward_values(node.disruption, node.disruption_step).items():
            setattr(node, field, value)
        changed.append(node)
    fields = [field for _, field in OLD_FIELDS]
    Node.objects.bulk_update(changed, fields, batch_size=500)


class Migration(migrations.Migration):
    dependencies = [
        ("nodepools", "0014_nodepool_gpu_publishing"),
    ]

    operations = [
        migrations.AddField(
            model_name="node",
            name="disruption",
            field=models.CharField(
                blank=True,
                choices=[
                    ("isolation-change", "Isolation Change"),
                    ("upgrade", "Upgrade"),
                    ("repair", "Repair"),
                    ("move", "Move"),
                    ("scale-down", "Scale Down"),
                    ("deletion", "Deletion"),
                ],
                max_length=16,
            ),
        ),
        migrations.AddField(
            model_name="node",
            name="disruption_step",
            field=models.CharField(
                blank=True,
                choices=[
                    ("draining", "Draining"),
                    ("drain-blocked", "Drain Blocked"),
                    ("validating", "Validating"),
                    ("verifying", "Verifying"),
                    ("rolling-back", "Rolling Back"),
                    ("requested", "Requested"),
                    ("rebooting", "Rebooting"),
                    ("replacing", "Replacing"),
                    ("moved", "Moved"),
                ],
                max_length=16,
            ),
        ),
        migrations.RunPython(forward, backward),
    ]
