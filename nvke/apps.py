from django.apps import AppConfig


class NvkeConfig(AppConfig):
    name = "nvke"
    verbose_name = "NVKE core"

    def ready(self) -> None:
        from . import schema  # noqa: F401  (registers drf-spectacular extensions)
