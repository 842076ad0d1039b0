from django.apps import AppConfig


class NvkeConfig(AppConfig):
    name = "nvke"
    verbose_name = "NVKE core"

    def ready(self) -> None:
        from axes.models import AccessAttempt, AccessFailureLog, AccessLog
        from django.db.models.signals import pre_save

        # metrics, drf-spectacular extensions, the `check --deploy` secrets check
        from . import observability, schema, secrets_check  # noqa: F401
        from .redaction import redact_login_record

        # django-axes' login records are logs: no invitation token or reset link in them
        for model in (AccessLog, AccessAttempt, AccessFailureLog):
            pre_save.connect(
                redact_login_record, sender=model, dispatch_uid=f"nvke.redact.{model.__name__}"
            )
