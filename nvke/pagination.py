"""Default list pagination: ``?limit=&offset=`` (max 500), ``{count, next, previous, results}``."""

from rest_framework.pagination import LimitOffsetPagination


class DefaultPagination(LimitOffsetPagination):
    default_limit = 50
    max_limit = 500
