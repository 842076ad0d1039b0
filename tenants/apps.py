from django.apps import AppConfig


class TenantsConfig(AppConfig):
    name = "tenants"
    verbose_name = "Tenants and access"

    def ready(self) -> None:
        from . import key_cache  # noqa: F401 (its receivers drop cached keys on change)
