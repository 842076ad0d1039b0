"""A short-lived cache of API keys that authenticated, in the shared cache (Redis), so a request
with a key seen recently costs one cache read instead of a database query (issue 15: lists at
framework speed; the key lookup was a third of a page's queries).

Entry: ``nvke:apikey:<prefix>`` (Django cache key) -> the key row's ``hashed_key``, tenant,
role, operator flag, expiry and ``last_used_at``, kept :data:`TTL_S` seconds. The presented key
is still verified against the cached hash (SHA-512, as ``djangorestframework-api-key`` does), so
a wrong secret with a known prefix is refused exactly as the database lookup refuses it; an
expired entry is refused by its ``expiry_date``.

Revocation is honoured at once: saving or deleting an ``ApiKey`` (``revoke_api_key`` saves
``revoked=True``; a tenant's deletion deletes its keys) and saving or deleting a ``Tenant``
deletes the entries, immediately and again when the transaction commits (a request that read
the row before the commit cannot leave an entry that outlives the commit by more than
:data:`TTL_S`). A bulk ``.update()`` of key rows sends no signal: its effect shows after at most
:data:`TTL_S` seconds (NVKE's own code revokes through ``revoke_api_key``).

Only valid keys are cached (an unknown key always reaches the database). The cache unreachable:
the lookup goes to the database, as before the cache (counted as a miss, never a 5xx).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.core.cache import cache
from django.db import transaction
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver
from rest_framework_api_key.crypto import KeyGenerator

from .models import ApiKey, Tenant

log = logging.getLogger(__name__)

#: seconds an entry lives without being refreshed (a bound for changes that send no signal)
TTL_S = 30

_verify = KeyGenerator().verify


@dataclass(frozen=True)
class CachedKey:
    """What authentication needs of a key row (``tenant`` is the Tenant row, or None)."""

    pk: Any
    prefix: str
    hashed_key: str
    tenant: Tenant | None
    role: str
    is_operator: bool
    expiry_date: datetime | None
    last_used_at: datetime | None

    @classmethod
    def of(cls, row: ApiKey) -> CachedKey:
        return cls(
            pk=row.pk,
            prefix=row.prefix,
            hashed_key=row.hashed_key,
            tenant=row.tenant,
            role=row.role,
            is_operator=row.is_operator,
            expiry_date=row.expiry_date,
            last_used_at=row.last_used_at,
        )


def _key(prefix: str) -> str:
    return f"apikey:{prefix}"


def lookup(key: str) -> CachedKey | None:
    """The cached entry of ``key`` (``<prefix>.<secret>``) when its secret matches the cached
    hash; None when there is no entry, the cache is unreachable, or the secret is wrong (the
    caller then asks the database, which gives the authoritative answer)."""
    prefix, _, _ = key.partition(".")
    if not prefix:
        return None
    try:
        entry = cache.get(_key(prefix))
    except Exception as exc:  # the cache's Redis unreachable: the database answers
        log.debug("API key cache unavailable: %s", exc)
        return None
    if not isinstance(entry, CachedKey) or not _verify(key, entry.hashed_key):
        return None
    return entry


def store(entry: CachedKey) -> None:
    """Cache a key row that just authenticated (a failure to write is ignored)."""
    try:
        cache.set(_key(entry.prefix), entry, timeout=TTL_S)
    except Exception as exc:
        log.debug("API key cache unavailable: %s", exc)


def forget(*prefixes: str) -> None:
    """Delete the entries of ``prefixes`` now and again once the transaction commits."""
    keys = [_key(p) for p in prefixes if p]
    if not keys:
        return

    def delete() -> None:
        try:
            cache.delete_many(keys)
        except Exception as exc:  # unreachable: entries expire after TTL_S
            log.warning("API key cache entries not deleted (%s): they expire in %ss", exc, TTL_S)

    delete()
    transaction.on_commit(delete)


@receiver(post_save, sender=ApiKey, dispatch_uid="apikey_cache_on_save")
@receiver(post_delete, sender=ApiKey, dispatch_uid="apikey_cache_on_delete")
def _key_changed(sender, instance: ApiKey, **kwargs) -> None:
    forget(instance.prefix)


@receiver(post_save, sender=Tenant, dispatch_uid="apikey_cache_on_tenant_save")
@receiver(post_delete, sender=Tenant, dispatch_uid="apikey_cache_on_tenant_delete")
def _tenant_changed(sender, instance: Tenant, created: bool = False, **kwargs) -> None:
    if created:
        return  # a new tenant has no keys yet
    forget(*ApiKey.objects.filter(tenant_id=instance.pk).values_list("prefix", flat=True))
