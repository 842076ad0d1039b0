"""The environment of a hosted control plane's processes (no process started here)."""

from __future__ import annotations

import pytest

from clusters.hosted.processes import environment


def test_only_the_apiserver_gets_the_configured_gogc(settings) -> None:
    settings.NVKE_HOSTED_APISERVER_GOGC = 40
    assert environment("kube-apiserver") == {"GOGC": "40"}
    assert environment("kube-controller-manager") == {}
    assert environment("kube-scheduler") == {}


def test_a_gogc_below_1_is_refused_naming_the_setting(settings) -> None:
    settings.NVKE_HOSTED_APISERVER_GOGC = 0
    with pytest.raises(ValueError, match="NVKE_HOSTED_APISERVER_GOGC must be 1 or more"):
        environment("kube-apiserver")
