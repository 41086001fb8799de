"""memoryRef issuing and resolution (RFC 0004 §C, §F).

An issued ref is ``owm1.`` followed by base64url of three keyed MACs: the tenant's id, the
scope's id (tenant, agent, namespace) and a tag over both. It is deterministic, short
(61 characters whatever the names), reveals no names, and cannot be altered or forged
without the database's key. Any other well-formed string is a *plain ref*, scoped to the
calling run's tenant.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import time

import structlog
from openwop_memory_client import ForbiddenError

from ..storage.base import Scope

ISSUED_PREFIX = "owm1."
MAX_REF_CHARS = 512
_TENANT_BYTES, _SCOPE_BYTES, _TAG_BYTES = 12, 16, 12
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_SEGMENTS = re.compile(r"[/\\]")
# A rejected issued ref is logged at most once per this many seconds (the rest counted).
REJECTION_LOG_INTERVAL = 10.0

log = structlog.get_logger("openwop_memory.refs")


def is_malformed(ref: str) -> bool:
    """True for refs that resolve to nothing: empty, too long, control chars, ``..`` segments."""
    return (
        not ref
        or len(ref) > MAX_REF_CHARS
        or _CONTROL.search(ref) is not None
        or ".." in _SEGMENTS.split(ref)
    )


class RefCodec:
    """Issues and resolves memoryRefs with one database-wide MAC key."""

    def __init__(self, key: bytes, cache_size: int = 4096) -> None:
        self._key = key
        # Every memory call resolves a ref; HMACs are cheap but not free on the hot path.
        self._cache: dict[tuple[str, str], Scope | None] = {}
        self._cache_size = cache_size
        self.rejected = 0  # issued refs that failed verification (see _rejected)
        self._quiet_until = 0.0
        self._unlogged = 0

    def _mac(self, label: bytes, *parts: bytes, size: int) -> bytes:
        msg = label + b"".join(len(p).to_bytes(4, "big") + p for p in parts)
        return hmac.new(self._key, msg, hashlib.sha256).digest()[:size]

    def seal_cursor(self, scope: Scope, snapshot: object, position: int) -> str:
        """A page cursor: ``position`` under a MAC binding it to the scope and the run's
        snapshot, so it cannot be altered, nor used in another scope or snapshot."""
        raw = position.to_bytes(8, "big")
        mac = self._cursor_mac(scope, snapshot, raw)
        return "c1." + base64.urlsafe_b64encode(raw + mac).decode().rstrip("=")

    def open_cursor(self, cursor: str, scope: Scope, snapshot: object) -> int | None:
        """The position sealed in ``cursor`` for this scope and snapshot, or ``None`` when
        it is not a cursor this database issued for them."""
        if not cursor.startswith("c1."):
            return None
        try:
            blob = base64.urlsafe_b64decode(cursor[3:] + "=" * (-len(cursor[3:]) % 4))
        except (binascii.Error, ValueError):
            return None
        if len(blob) != 8 + 16:
            return None
        raw, mac = blob[:8], blob[8:]
        if not hmac.compare_digest(mac, self._cursor_mac(scope, snapshot, raw)):
            return None
        return int.from_bytes(raw, "big")

    def _cursor_mac(self, scope: Scope, snapshot: object, raw: bytes) -> bytes:
        parts = (scope.tenant.encode(), scope.key.encode(), repr(snapshot).encode(), raw)
        return self._mac(b"cursor", *parts, size=16)

    def keyed_id(self, text: str) -> str:
        """A stable keyed digest of a client-chosen string, safe to store in its place."""
        return self._mac(b"name", text.encode(), size=16).hex()

    def _tenant_id(self, tenant: str) -> bytes:
        return self._mac(b"tenant", tenant.encode(), size=_TENANT_BYTES)

    def issue(self, tenant: str, agent: str, namespace: str) -> str:
        """The deterministic ref for the scope (tenant, agent, namespace)."""
        tenant_id = self._tenant_id(tenant)
        scope_id = self._mac(
            b"scope", tenant.encode(), agent.encode(), namespace.encode(), size=_SCOPE_BYTES
        )
        tag = self._mac(b"ref", tenant_id, scope_id, size=_TAG_BYTES)
        return ISSUED_PREFIX + base64.urlsafe_b64encode(tenant_id + scope_id + tag).decode()

    def handle(self, scope: Scope) -> dict[str, str]:
        """How a change record names its scope: an issued scope by its memoryRef (the one
        :meth:`issue` gave), a plain one by its stored key (a keyed digest of the plain
        ref, which :meth:`plain_handle` computes from the ref)."""
        if scope.key.startswith("issued:"):
            tenant_id = self._tenant_id(scope.tenant)
            scope_id = bytes.fromhex(scope.key.removeprefix("issued:"))
            tag = self._mac(b"ref", tenant_id, scope_id, size=_TAG_BYTES)
            raw = tenant_id + scope_id + tag
            return {"memoryRef": ISSUED_PREFIX + base64.urlsafe_b64encode(raw).decode()}
        return {"scope": scope.key}

    def resolve(self, ref: str, run_tenant: str) -> Scope | None:
        """The scope a run of ``run_tenant`` reaches through ``ref``.

        Returns ``None`` for a malformed or tampered ref (it resolves to nothing).

        :raises ForbiddenError: ``ref`` is a valid issued ref of another tenant.
        """
        if len(ref) > MAX_REF_CHARS:
            return None  # and keep oversized strings out of the cache
        key = (ref, run_tenant)
        try:
            return self._cache[key]
        except KeyError:
            pass
        scope = self._resolve(ref, run_tenant)  # a forbidden ref raises and is not cached
        if scope is None and ref.startswith(ISSUED_PREFIX):
            self._rejected(run_tenant)
            return None  # not cached: each use is counted
        if len(self._cache) >= self._cache_size:
            self._cache.clear()
        self._cache[key] = scope
        return scope

    def names_tenant(self, ref: str, tenant: str) -> bool:
        """Whether ``ref`` is a valid issued ref of ``tenant``: a check, not a use (a ref
        failing it is not counted or logged as rejected; :meth:`resolve` does that)."""
        if len(ref) > MAX_REF_CHARS or not ref.startswith(ISSUED_PREFIX):
            return False
        cached = self._cache.get((ref, tenant))
        if cached is not None:
            return True
        try:
            return self._resolve(ref, tenant) is not None
        except ForbiddenError:
            return False

    def _rejected(self, tenant: str) -> None:
        """Count an issued ref that failed verification, and log it (rate-limited, never
        the ref): forged and altered refs end here, and so does every ref after the
        database was replaced, since refs are verified with a key stored in it."""
        self.rejected += 1
        now = time.monotonic()
        if now < self._quiet_until:
            self._unlogged += 1
            return
        self._quiet_until = now + REJECTION_LOG_INTERVAL
        log.warning(
            "ref_rejected",
            tenant=tenant,
            suppressed=self._unlogged,
            hint="an issued memoryRef failed verification: forged or altered, or issued "
            "under another database's key (was the database replaced, or its path mistyped?)",
        )
        self._unlogged = 0

    def _resolve(self, ref: str, run_tenant: str) -> Scope | None:
        if is_malformed(ref):
            return None
        if not ref.startswith(ISSUED_PREFIX):
            # Stored as a keyed digest: a plain ref is the worker's own string, and the
            # database should not keep whatever the worker chose to put in it.
            return Scope(run_tenant, "plain:" + self.keyed_id(ref))
        try:
            raw = base64.urlsafe_b64decode(ref[len(ISSUED_PREFIX) :].encode("ascii"))
        except (binascii.Error, UnicodeEncodeError, ValueError):
            return None
        if len(raw) != _TENANT_BYTES + _SCOPE_BYTES + _TAG_BYTES:
            return None
        # b64decode skips stray characters and ignores padding bits: demand the one encoding.
        if base64.urlsafe_b64encode(raw).decode() != ref[len(ISSUED_PREFIX) :]:
            return None
        tenant_id = raw[:_TENANT_BYTES]
        scope_id = raw[_TENANT_BYTES : _TENANT_BYTES + _SCOPE_BYTES]
        tag = raw[_TENANT_BYTES + _SCOPE_BYTES :]
        if not hmac.compare_digest(tag, self._mac(b"ref", tenant_id, scope_id, size=_TAG_BYTES)):
            return None
        if not hmac.compare_digest(tenant_id, self._tenant_id(run_tenant)):
            raise ForbiddenError("the memoryRef belongs to another tenant", {"field": "memoryRef"})
        return Scope(run_tenant, "issued:" + scope_id.hex())
