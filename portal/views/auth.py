"""Login, logout and the landing page (Django's auth views with the portal's templates)."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse, reverse_lazy


class LoginView(auth_views.LoginView):
    """Username + password; then ``next``, or the landing page (operators: the console)."""

    template_name = "portal/login.html"
    redirect_authenticated_user = True

    def get_default_redirect_url(self) -> str:
        return reverse("portal:home")


class LogoutView(auth_views.LogoutView):
    """POST only (Django 5), back to the login page."""

    next_page = reverse_lazy("portal:login")


def home(request: HttpRequest) -> HttpResponse:
    """``/``: operators land on the console, tenants on their clusters, strangers on login."""
    if not request.user.is_authenticated:
        return redirect("portal:login")
    if request.user.is_staff:
        return redirect("console:overview")
    return redirect("portal:cluster-list")
