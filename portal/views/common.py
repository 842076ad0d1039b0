"""Small pieces shared by the portal's views."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from rest_framework import serializers

from nvke.errors import ApiError, NotFound
from portal.forms import ApiForm, show_api_error, show_validation_errors, validate_with

T = TypeVar("T")


def call_service(form: ApiForm, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
    """Run an API serializer check or a service; put its refusal on ``form`` (None then).

    ``NotFound`` is not a form error: it propagates to the page guard (the 404 page).
    """
    try:
        return fn(*args, **kwargs)
    except NotFound:
        raise
    except serializers.ValidationError as exc:
        show_validation_errors(form, exc)
    except ApiError as exc:
        show_api_error(form, exc)
    return None


def validate_then_call(
    form: ApiForm,
    serializer_class: type[serializers.Serializer],
    body: dict[str, Any],
    fn: Callable[..., T],
    **kwargs: Any,
) -> tuple[dict[str, Any] | None, T | None]:
    """The portal's write path, as the API's view takes it: validate ``body`` with the API's
    serializer (:func:`portal.forms.validate_with`), then call the service ``fn`` with
    ``kwargs`` and the validated fields. A refusal of either lands on ``form``
    (:func:`call_service`). Returns ``(validated fields or None, the service's result or
    None)``."""
    data = call_service(form, validate_with, serializer_class, body)
    if data is None:
        return None, None
    return data, call_service(form, fn, **kwargs, **data)


def confirm_delete(
    request: HttpRequest,
    *,
    name: str,
    delete: Callable[[], Any],
    done: str,
    back: str,
    page: dict[str, Any],
) -> HttpResponse:
    """The delete page of a named object: its ``name`` typed again (checked here, not only in
    the browser), then ``delete()`` (a service call answering an Operation). On success the
    message ``done`` and a redirect to ``back``; a refusal of the service shows on the page
    (400), as does a wrong name. ``page``: the rest of ``portal/confirm.html``'s context
    (``kind``, ``disruption``, ``title``, ``message``, ``button``, ``cancel``, ``cli``)."""
    from portal.confirm import ConfirmNameForm
    from portal.forms import ScaleForm

    form = ScaleForm()  # a carrier for a refusal (already deleted)
    confirm_form = ConfirmNameForm(request.POST if request.method == "POST" else None, name=name)
    status = 200
    if request.method == "POST":
        form.is_valid()
        if not confirm_form.is_valid():
            status = 400
        else:
            if call_service(form, delete) is not None:
                messages.success(request, done)
                return redirect(back)
            status = 400
    context = {"form": form, "confirm_form": confirm_form, **page}
    return render(request, "portal/confirm.html", context, status=status)


def is_htmx(request: HttpRequest) -> bool:
    """True for a request htmx sent (it adds ``HX-Request: true``)."""
    return request.headers.get("HX-Request") == "true"
