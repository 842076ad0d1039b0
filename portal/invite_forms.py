"""Forms of the invitation flow: the owner's invite form and the invitee's sign-up form."""

from __future__ import annotations

from typing import Any

from django import forms

from portal.forms import ApiForm
from tenants.choices import Role
from tenants.invitations import TTL_CHOICES_H


class InviteForm(ApiForm):
    """Who to invite, with which role, for how long the link works."""

    email = forms.EmailField(label="Email", max_length=254)
    role = forms.ChoiceField(label="Role", choices=Role.choices, initial=Role.MEMBER)
    ttl_hours = forms.TypedChoiceField(
        label="Link valid for",
        coerce=int,
        choices=[(h, f"{h // 24} day(s)") for h in TTL_CHOICES_H],
        initial=72,
    )


class AcceptForm(ApiForm):
    """A new account for the invitee: a username and a password typed twice (the password
    validators run in :func:`tenants.invitations.accept`; their refusal shows here)."""

    api_fields = {"password": "new_password1"}

    username = forms.RegexField(
        label="Username",
        max_length=150,
        regex=r"^[\w.@+-]+\Z",
        error_messages={"invalid": "letters, digits and @ . + - _ only"},
    )
    new_password1 = forms.CharField(
        label="Password", strip=False, max_length=128, widget=forms.PasswordInput()
    )
    new_password2 = forms.CharField(
        label="Password again", strip=False, max_length=128, widget=forms.PasswordInput()
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if data.get("new_password1") and data.get("new_password1") != data.get("new_password2"):
            self.add_error("new_password2", "the two passwords differ")
        return data
