"""API router: routes match with or without a trailing slash (``/clusters`` and ``/clusters/``)."""

from rest_framework.routers import SimpleRouter


class OptionalSlashRouter(SimpleRouter):
    def __init__(self) -> None:
        super().__init__()
        self.trailing_slash = "/?"
