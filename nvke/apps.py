from django.apps import AppConfig


class NvkeConfig(AppConfig):
    name = "nvke"
    verbose_name = "NVKE core"
