from django.apps import AppConfig


class NvkeConfig(AppConfig):
    name = "nvke"
    verbose_name = "NVKE core"

    def ready(self) -> None:
        # metrics, drf-spectacular extensions, the `check --deploy` secrets check
        from . import observability, schema, secrets_check  # noqa: F401
