"""Tenants: who is asking, how much of the server they may hold, and whose cache they share.

A server shared by several customers (tenants) needs three things the engine does not know
about. Each API key maps to a tenant (``Authorization: Bearer KEY``); with no keys configured
the server is open and every caller is the tenant ``default``. Each tenant may hold at most
``max_in_flight`` requests at once, so one tenant's burst queues (429) at its own door instead
of starving the others. And each tenant gets a *cache salt*: a prefix cache keyed by
(salt, tokens) only lets requests of the same tenant share blocks, which closes the timing side
channel a shared prefix cache opens (another tenant's fast TTFT tells you its prompt was
cached). vLLM calls this per-request value ``cache_salt``; a shared cache is the default there,
as here. The salt must be one a client cannot choose or guess: the server derives it from the
authenticated tenant and a secret of its own (an HMAC), never from the request body, so an
attacker who knows a tenant's name still cannot enter that tenant's namespace.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
from collections import Counter


class UnknownKeyError(PermissionError):
    """No tenant has this API key (HTTP 401)."""


class TenantLimitError(RuntimeError):
    """The tenant already holds as many requests as it may (HTTP 429)."""


class Tenants:
    """API keys to tenants, per-tenant in-flight limits and cache salts.

    ``keys`` maps API key to tenant name (None: an open server, one tenant ``default``);
    ``max_in_flight`` caps each tenant's concurrent requests (None: no cap); ``salted`` gives
    each tenant its own prefix-cache namespace, whose salt is an HMAC-SHA256 of the tenant's
    name under ``salt_secret`` (32 random bytes drawn per server when None).
    """

    def __init__(self, keys: dict[str, str] | None = None, max_in_flight: int | None = None,
                 salted: bool = False, salt_secret: bytes | None = None):
        if max_in_flight is not None and max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self.keys = dict(keys) if keys else None
        self.max_in_flight = max_in_flight
        self.salted = salted
        self._salt_secret = secrets.token_bytes(32) if salt_secret is None else bytes(salt_secret)
        self.in_flight: Counter[str] = Counter()
        self._lock = threading.Lock()

    @classmethod
    def parse(cls, pairs: list[str], **kwargs) -> "Tenants":
        """From command-line ``KEY=TENANT`` pairs."""
        keys = {}
        for pair in pairs:
            key, sep, tenant = pair.partition("=")
            if not sep or not key or not tenant:
                raise ValueError(f"--api-key takes KEY=TENANT, got {pair!r}")
            keys[key] = tenant
        return cls(keys or None, **kwargs)

    def tenant_of(self, authorization: str | None) -> str:
        """The tenant of an ``Authorization`` header value; UnknownKeyError if none matches."""
        if self.keys is None:
            return "default"
        scheme, _, key = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or key.strip() not in self.keys:
            raise UnknownKeyError("invalid or missing API key: send Authorization: Bearer KEY")
        return self.keys[key.strip()]

    def cache_salt(self, tenant: str) -> str | None:
        """The salt of the tenant's prefix-cache namespace (None: the shared namespace).

        A 256-bit HMAC of the tenant's name under the server's secret: the same tenant always
        gets the same salt, and no one without the secret can compute another tenant's.
        """
        if not self.salted:
            return None
        return hmac.new(self._salt_secret, tenant.encode(), hashlib.sha256).hexdigest()

    def acquire(self, tenant: str) -> None:
        """Count one more request of ``tenant`` in flight, or raise TenantLimitError."""
        with self._lock:
            if self.max_in_flight is not None and self.in_flight[tenant] >= self.max_in_flight:
                raise TenantLimitError(f"tenant {tenant!r} already has {self.max_in_flight} "
                                       "requests in flight; retry when one finishes")
            self.in_flight[tenant] += 1

    def release(self, tenant: str) -> None:
        with self._lock:
            self.in_flight[tenant] -= 1
