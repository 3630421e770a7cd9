"""The opt-in ``tenant`` label: who sent a request, from a configured request header, bounded
like ``model`` and never a credential.

The header is named by the operator (``--tenant-header X-Tenant``); a gateway in front
usually sets one from the authenticated key (Envoy, Kong and LiteLLM all can), so the value
is a name or key *id*. Two guards keep secrets out of label values, where everyone who can
read Prometheus would see them:

- A header that carries credentials (``Authorization``, ``Cookie``, ``X-Api-Key``, any name
  with ``token``, ``secret``, ``password``, ``session``, ``credential`` or ending in ``key``)
  is refused at start. Hashing it instead was considered and rejected: a hash of a bearer
  token is still a stable identifier of that secret in every series, an unkeyed hash of a
  short key can be guessed offline, and a keyed hash needs a second secret to manage and
  gives labels nobody can read. An API-key *id* header (``X-Api-Key-Id``) is fine.
- A value is kept only if it looks like a name: at most 64 characters of letters, digits and
  ``. _ : @ / -``, starting with a letter or digit, and without the prefix of a well-known
  secret format (``sk-``, ``Bearer``, a JWT's ``eyJ``, ...). Anything else is ``other``.

Bounding is :class:`~sidecar.base.labels.BoundedLabel`'s: an allowlist, else values that
got an answer that was not a 4xx, at most ``max_tenants`` of them, idle ones forgotten; ``other`` otherwise; a
request without the header is ``unknown``. The header is read, never changed: the upstream gets it as the client sent it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Unpack

from .labels import OTHER, BoundedLabel, LabelOptions

__all__ = ["TenantLabeler", "check_tenant_header", "CREDENTIAL_HEADER_HINT"]

_CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie"})
_CREDENTIAL_WORDS = (
    "auth",
    "token",
    "secret",
    "password",
    "passwd",
    "session",
    "credential",
    "cookie",
)
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 field-name
_VALUE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/-]{0,63}")
# Prefixes of common secret formats: OpenAI/Anthropic/Stripe keys, GitHub, Hugging Face,
# Slack and AWS access keys, JWTs, HTTP auth schemes pasted into the wrong header.
_SECRET_PREFIXES = (
    "sk-",
    "sk_",
    "rk_",
    "pk_",
    "ghp_",
    "gho_",
    "github_pat_",
    "hf_",
    "xox",
    "akia",
    "eyj",
    "bearer",
    "basic",
)
CREDENTIAL_HEADER_HINT = (
    "use a header that names the tenant or the key's id (e.g. X-Tenant, X-Api-Key-Id)"
)


def check_tenant_header(name: str) -> str:
    """The header name, or ValueError when it is not a header name or carries credentials."""
    if not _TOKEN.fullmatch(name):
        raise ValueError(f"{name!r} is not an HTTP header name")
    lower = name.lower()
    if (
        lower in _CREDENTIAL_HEADERS
        or lower.endswith("key")
        or any(w in lower for w in _CREDENTIAL_WORDS)
    ):
        raise ValueError(
            f"{name!r} carries credentials and would put secrets in label values; {CREDENTIAL_HEADER_HINT}"
        )
    return name


def _name_like(value: str) -> bool:
    return _VALUE.fullmatch(value) is not None and not value.lower().startswith(_SECRET_PREFIXES)


class TenantLabeler:
    """Request headers -> a bounded ``tenant`` label value. No server lists its tenants, so a
    value earns its slot with an answer that is not a 4xx (:class:`~sidecar.base.labels.BoundedLabel`,
    which ``kwargs`` go to: the idle time, the series budget, the overflow and forget hooks)."""

    def __init__(
        self,
        header: str,
        allowlist: Iterable[str] = (),
        max_tenants: int = 20,
        **kwargs: Unpack[LabelOptions],
    ) -> None:
        self.header = check_tenant_header(header)
        kwargs.setdefault(
            "name", "tenant"
        )  # what a new value costs: one series in each family with the label
        self.bound = BoundedLabel(allowlist, max_tenants, **kwargs)

    def _value(self, headers: Mapping[str, str]) -> str | None:
        value = (headers.get(self.header) or "").strip()
        return value or None

    def __call__(self, headers: Mapping[str, str]) -> str:
        value = self._value(headers)
        if value and not _name_like(value):
            return OTHER
        return self.bound(value)

    def settle(self, headers: Mapping[str, str], status: int | None) -> str:
        value = self._value(headers)
        if value and not _name_like(value):
            return OTHER
        return self.bound.settle(value, status)

    def hold(self, label: str) -> None:
        """A request labelled ``label`` at its start keeps it (slot and series) until
        :meth:`release`: an idle expiry mid-stream would drop the tenant's series under it."""
        self.bound.hold(label)

    def release(self, label: str) -> None:
        self.bound.release(label)
