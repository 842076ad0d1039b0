"""nvkectl's one-line errors (cli/nvkectl/api.py)."""

from __future__ import annotations

from nvkectl.api import ApiError


def test_an_api_refusal_names_its_code_and_http_status():
    err = ApiError(409, "duplicate_cluster_name", "a cluster named 'train' already exists")
    assert err.one_line() == (
        "error: a cluster named 'train' already exists (duplicate_cluster_name, HTTP 409)"
    )


def test_a_failed_operation_has_no_http_status_to_name():
    """Found by a new-user trial: a --wait that saw its operation fail printed "HTTP 0"."""
    err = ApiError(0, "insufficient_capacity", "SET_NODE_POOL_SIZE FAILED: no free host")
    assert err.one_line() == (
        "error: SET_NODE_POOL_SIZE FAILED: no free host (insufficient_capacity)"
    )
    field = ApiError(400, "invalid_number", "not a number", field="limit").one_line()
    assert field == "error: not a number [field limit] (invalid_number, HTTP 400)"
