from django.apps import AppConfig


class NvkeConfig(AppConfig):
    name = "nvke"
    verbose_name = "NVKE core"

    def ready(self) -> None:
        from . import observability, schema  # noqa: F401  (metrics, drf-spectacular extensions)
