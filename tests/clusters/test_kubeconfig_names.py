"""The served kubeconfig names cluster, user and context ``nvke_<tenant>_<region>_<cluster>``."""

from __future__ import annotations

import pytest
import yaml

from clusters.kubeconfig_names import context_name, rename_kubeconfig
from tests.helpers import drive_cluster

PROVIDER_KUBECONFIG = """apiVersion: v1
kind: Config
clusters:
- name: train
  cluster:
    server: https://10.0.0.1:6443
contexts:
- name: train
  context:
    cluster: train
    user: train-admin
current-context: train
users:
- name: train-admin
  user:
    token: abc
"""


def test_context_names_are_lower_case_and_safe():
    assert context_name(tenant="Acme AI", region="us-east-1", cluster="train") == (
        "nvke_acme-ai_us-east-1_train"
    )


def test_rename_names_every_entry_and_keeps_the_credential():
    out = yaml.safe_load(rename_kubeconfig(PROVIDER_KUBECONFIG, "nvke_acme_us-east-1_train"))
    name = "nvke_acme_us-east-1_train"
    assert out["clusters"] == [{"name": name, "cluster": {"server": "https://10.0.0.1:6443"}}]
    assert out["users"] == [{"name": name, "user": {"token": "abc"}}]
    assert out["contexts"] == [{"name": name, "context": {"cluster": name, "user": name}}]
    assert out["current-context"] == name


def test_rename_refuses_what_is_not_a_kubeconfig():
    with pytest.raises(ValueError):
        rename_kubeconfig("just: text", "x")


@pytest.mark.django_db
def test_the_api_serves_the_kubeconfig_under_the_unique_name(owner, tenant_a, import_capture):
    import_capture("a10g.xml", "gpu-a10g-01", "us-east-1b")
    op = owner.post(
        "/api/v1/clusters", {"name": "c1", "kubernetes_version": "1.36", "region": "us-east-1"}
    ).json()
    drive_cluster(op["target_id"])
    served = yaml.safe_load(owner.get(f"/api/v1/clusters/{op['target_id']}/kubeconfig").content)
    # tenant_a is named "tenant-a"; the cluster is in us-east-1
    assert served["current-context"] == "nvke_tenant-a_us-east-1_c1"
    assert [c["name"] for c in served["clusters"]] == ["nvke_tenant-a_us-east-1_c1"]
    assert served["users"][0]["user"]["token"]
