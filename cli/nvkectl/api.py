"""A small HTTP client for ``/api/v1``: Bearer key, JSON, problem+json errors as exceptions."""

from __future__ import annotations

from typing import Any

import requests

from .config import Context, resolve


class ApiError(Exception):
    """An error answer of the API: ``status``, ``code`` (stable) and ``detail`` (for people).
    ``status`` 0: no HTTP answer carries the error (the server unreachable, an operation that
    failed or did not finish while ``--wait`` followed it)."""

    def __init__(self, status: int, code: str, detail: str, field: str | None = None) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail, self.field = status, code, detail, field

    def one_line(self) -> str:
        where = f" [field {self.field}]" if self.field and self.field not in self.detail else ""
        http = f", HTTP {self.status}" if self.status else ""
        return f"error: {self.detail}{where} ({self.code}{http})"


class Client:
    def __init__(self, context: Context, timeout: float = 30) -> None:
        self.base = context.server.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {context.api_key}"
        self.session.headers["User-Agent"] = "nvkectl/0.1"

    @classmethod
    def for_context(cls, name: str | None) -> Client:
        """A client for the named context (None: the current one); ConfigError if none."""
        return cls(resolve(name))

    def request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        url = path if path.startswith("http") else f"{self.base}/api/v1/{path.lstrip('/')}"
        try:
            resp = self.session.request(method, url, timeout=self.timeout, **kwargs)
        except requests.RequestException as exc:
            raise ApiError(0, "unreachable", f"cannot reach {self.base}: {exc}") from None
        if resp.status_code >= 400:
            raise _error(resp)
        return resp

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self.request(method, path, **kwargs).json()

    def list_all(self, path: str, **params: Any) -> list[dict[str, Any]]:
        """Every item of a paginated list (follows ``next``)."""
        page = self.json("GET", path, params=params)
        if isinstance(page, list):
            return page
        items = list(page["results"])
        while page.get("next"):
            page = self.json("GET", page["next"])
            items.extend(page["results"])
        return items


def _error(resp: requests.Response) -> ApiError:
    try:
        body = resp.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and "code" in body:
        return ApiError(resp.status_code, body["code"], body.get("detail", ""), body.get("field"))
    return ApiError(resp.status_code, "http_error", resp.text[:200] or resp.reason)
