from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "webhooks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import receivers  # noqa: F401  (connect to the lower apps' signals)
