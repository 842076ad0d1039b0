"""An operation's progress reads its count once (issue 33 item 6): a stage that starts with
the count ("1 of 1 node(s) ready") showed as "1/1 1 of 1 node(s) ready"."""

from __future__ import annotations

from portal.templatetags.portal_tags import progress_steps


def test_a_stage_that_counts_itself_gets_no_second_count():
    steps = progress_steps({"done": 1, "total": 1, "stage": "1 of 1 node(s) ready"})
    assert steps == {"value": 1, "max": 1, "label": ""}


def test_a_stage_without_the_count_keeps_it():
    steps = progress_steps({"done": 2, "total": 4, "stage": "placing nodes"})
    assert steps == {"value": 2, "max": 4, "label": "2/4"}
    assert progress_steps({"done": 0, "total": 0, "stage": ""})["label"] == "0/0"
    assert progress_steps({})["label"] == "0/?"
