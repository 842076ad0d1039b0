"""Login, logout and the landing page (Django's auth views with the portal's templates)."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect
from django.urls import reverse, reverse_lazy

from nvke import public_url


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


# ------------------------------------------------------------------ password reset (Django's)
# Django's views and forms: PasswordResetForm mails a one-time link (a token bound to the
# user's password hash and last login, valid PASSWORD_RESET_TIMEOUT seconds) to active users
# with a usable password (Django's default: a user the API's member endpoint created without
# one is not mailed; they join by an invitation link); SetPasswordForm runs
# AUTH_PASSWORD_VALIDATORS. The mail goes through Django's EMAIL_BACKEND (settings: EMAIL_URL).


class PasswordResetView(auth_views.PasswordResetView):
    """Django's view, except that the mailed link is built from ``NVKE_PUBLIC_URL``
    (:mod:`nvke.public_url`), never from the request's ``Host`` header: with any Host
    accepted, ``Host: evil.example`` had the victim mailed a link to the attacker's site."""

    template_name = "portal/password_reset_form.html"
    email_template_name = "portal/password_reset_email.txt"
    subject_template_name = "portal/password_reset_subject.txt"
    success_url = reverse_lazy("portal:password-reset-done")

    def form_valid(self, form):
        scheme, netloc = public_url.origin()
        form.save(
            domain_override=netloc,
            use_https=scheme == "https",
            token_generator=self.token_generator,
            from_email=self.from_email,
            email_template_name=self.email_template_name,
            subject_template_name=self.subject_template_name,
            request=self.request,
            html_email_template_name=self.html_email_template_name,
            extra_email_context=self.extra_email_context,
        )
        return HttpResponseRedirect(self.get_success_url())


class PasswordResetDoneView(auth_views.PasswordResetDoneView):
    template_name = "portal/password_reset_done.html"

    def get_context_data(self, **kwargs):
        from django.conf import settings

        context = super().get_context_data(**kwargs)
        context["timeout_days"] = max(1, settings.PASSWORD_RESET_TIMEOUT // 86400)
        return context


class PasswordResetConfirmView(auth_views.PasswordResetConfirmView):
    template_name = "portal/password_reset_confirm.html"
    success_url = reverse_lazy("portal:password-reset-complete")


class PasswordResetCompleteView(auth_views.PasswordResetCompleteView):
    template_name = "portal/password_reset_complete.html"
