"""With NVKE_INTERNAL_PORT set, /metrics and /admin/ exist on that port only."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


def test_metrics_and_admin_answer_only_on_the_internal_port(client, settings):
    settings.NVKE_INTERNAL_PORT = 9000
    assert client.get("/metrics", SERVER_PORT="8000").status_code == 404
    assert client.get("/admin/", SERVER_PORT="8000").status_code == 404
    internal = client.get("/metrics", SERVER_PORT="9000")
    assert internal.status_code == 200
    assert b"# TYPE" in internal.content
    assert client.get("/admin/", SERVER_PORT="9000").status_code == 302  # to the login
    assert client.get("/healthz", SERVER_PORT="8000").status_code == 200


def test_unset_every_path_answers_on_every_port(client, settings):
    settings.NVKE_INTERNAL_PORT = 0
    assert client.get("/metrics", SERVER_PORT="8000").status_code == 200
