"""The old per-caller sub-states become read-only columns derived from ``disruption`` and
``disruption_step`` (mapped by 0015): the step while the disruption is that caller's, else "".
Backward, they are plain columns again (0015's backward fills them)."""

from django.db import migrations, models


def _derived(disruption: str) -> models.GeneratedField:
    return models.GeneratedField(
        db_persist=True,
        expression=models.Case(
            models.When(disruption=disruption, then=models.F("disruption_step")),
            default=models.Value(""),
        ),
        output_field=models.CharField(blank=True, max_length=16),
    )


FIELDS = (
    ("config_state", "isolation-change"),
    ("upgrade_state", "upgrade"),
    ("repair_state", "repair"),
    ("move_state", "move"),
)


class Migration(migrations.Migration):
    dependencies = [
        ("nodepools", "0015_node_disruption"),
    ]

    operations = [
        *(migrations.RemoveField(model_name="node", name=name) for name, _ in FIELDS),
        *(
            migrations.AddField(model_name="node", name=name, field=_derived(disruption))
            for name, disruption in FIELDS
        ),
    ]
