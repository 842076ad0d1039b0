"""Portal and admin logins by username whatever its letter case.

Usernames are unique whatever their case (``tenants/migrations/0005``: "Alice" and "alice"
cannot both exist), so the account "Alice" is found when its owner types ``alice``, as
GitHub, GKE's console and most sign-in forms do. django-axes counts failed logins under the
lower-cased username (:func:`axes_username`, ``AXES_USERNAME_CALLABLE``), so typing ``ALICE``,
``Alice`` and ``alice`` in turn is one lockout, not three.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.http import HttpRequest


class CaseInsensitiveModelBackend(ModelBackend):
    """Django's ``ModelBackend`` with the user found by ``username__iexact``. As Django's
    does, it runs the password hasher once when no user matches, so the answer's timing does
    not tell whether the username exists. Returns the user, or None."""

    def authenticate(  # type: ignore[override]
        self,
        request: HttpRequest | None,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ):
        user_model = get_user_model()
        if username is None:
            username = kwargs.get(user_model.USERNAME_FIELD)
        if username is None or password is None:
            return None
        user = user_model._default_manager.filter(
            **{f"{user_model.USERNAME_FIELD}__iexact": username}
        ).first()
        if user is None:
            user_model().set_password(password)  # Django's timing defence (#20760)
            return None
        if user.check_password(password) and self.user_can_authenticate(user):
            return user
        return None


def axes_username(request: HttpRequest, credentials: dict | None = None) -> str | None:
    """The username django-axes records a login attempt under: the one typed, lower-cased
    (``AXES_USERNAME_CALLABLE``; axes passes the credentials given to ``authenticate``, or
    none, and then the login form's POST holds them)."""
    source = credentials if credentials else getattr(request, "POST", {})
    username = source.get("username") if source else None
    return username.lower() if isinstance(username, str) else username
