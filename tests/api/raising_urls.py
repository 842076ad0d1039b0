"""A URLconf whose views fail outside DRF (for the problem+json 500 test), with the project's
error handlers (Django reads them from the root URLconf)."""

from django.urls import path

from nvke.urls import handler400, handler403, handler404, handler500  # noqa: F401


def crash(request):
    raise RuntimeError("a bug outside DRF")


urlpatterns = [path("api/v1/crash", crash), path("crash", crash)]
