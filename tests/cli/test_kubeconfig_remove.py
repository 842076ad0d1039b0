"""``nvkectl.kubeconfig.remove``: a deleted cluster's context leaves the user's kubeconfig with
the cluster and user entries only it named (kubectl's own entries and shared ones stay)."""

from __future__ import annotations

import yaml
from nvkectl.kubeconfig import merge, remove, remove_from


def _config(*contexts: tuple[str, str, str], current: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": c, "cluster": {"server": f"https://{c}"}} for _, c, _ in contexts],
        "users": [{"name": u, "user": {"token": u}} for _, _, u in contexts],
        "contexts": [{"name": n, "context": {"cluster": c, "user": u}} for n, c, u in contexts],
        "current-context": current,
    }


def test_remove_takes_the_context_its_cluster_and_user():
    config = _config(
        ("other", "other", "other"),
        ("nvke_a_r_c", "nvke_a_r_c", "nvke_a_r_c"),
        current="nvke_a_r_c",
    )
    left = remove(config, "nvke_a_r_c")
    assert [e["name"] for e in left["clusters"]] == ["other"]
    assert [e["name"] for e in left["users"]] == ["other"]
    assert [e["name"] for e in left["contexts"]] == ["other"]
    assert left["current-context"] == ""


def test_a_user_another_context_still_names_stays_and_current_is_kept():
    config = _config(("ctx1", "c1", "shared"), ("ctx2", "c2", "shared"), current="ctx1")
    config["users"] = config["users"][:1]  # one "shared" user entry named by both contexts
    left = remove(config, "ctx2")
    assert [e["name"] for e in left["clusters"]] == ["c1"]
    assert [e["name"] for e in left["users"]] == ["shared"]
    assert left["current-context"] == "ctx1"


def test_no_such_context_changes_nothing(tmp_path):
    config = _config(("other", "other", "other"), current="other")
    assert remove(config, "gone") is config
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(config))
    before = path.read_text()
    assert remove_from(path, "gone") is False and path.read_text() == before
    assert remove_from(tmp_path / "missing", "gone") is False


def test_merge_then_remove_gives_the_original_entries_back(tmp_path):
    original = _config(("other", "other", "other"), current="other")
    new = _config(("nvke_t_r_x", "nvke_t_r_x", "nvke_t_r_x"), current="nvke_t_r_x")
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(merge(original, new)))
    assert remove_from(path, "nvke_t_r_x") is True
    left = yaml.safe_load(path.read_text())
    for section in ("clusters", "users", "contexts"):
        assert left[section] == original[section]
    assert left["current-context"] == ""
