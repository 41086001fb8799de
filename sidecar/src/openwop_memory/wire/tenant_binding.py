"""Tenant binding: which tenants the process at the other end of a connection may name.

Off unless ``tenant_binding`` is set. When set, the kernel's record of the connecting
process (``SO_PEERCRED``: its effective user and group ids when it connected) decides the
tenants it may use; the rules name ``uid:N`` or ``gid:N`` (the process's effective group,
not its supplementary groups, which ``SO_PEERCRED`` does not carry), and ``*`` allows
every tenant. A peer matching no rule may use no tenant at all. The check covers every
method that names a tenant (``memory.issueRef``, ``run.begin``); a method that names a run
by its id means a run of one of the peer's tenants only (runs are named by tenant and id,
and another tenant's run of the same id is answered as absent).
"""

from __future__ import annotations

import re
import socket
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

ANY_TENANT = "*"
RULE = re.compile(r"^(uid|gid):(\d{1,10})$")
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


@dataclass(frozen=True)
class Peer:
    """The connecting process as the kernel saw it when it connected."""

    pid: int
    uid: int
    gid: int


def peer_of(sock: socket.socket) -> Peer | None:
    """The credentials of ``sock``'s peer, or ``None`` if the kernel gives none."""
    try:
        data = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    except OSError:
        return None
    pid, uid, gid = _PEERCRED.unpack(data)
    return Peer(pid, uid, gid)


def permits(allowed: frozenset[str], tenant: str) -> bool:
    return ANY_TENANT in allowed or tenant in allowed


class TenantBinding:
    """The ``tenant_binding`` table: ``{"uid:N" | "gid:N": [tenant, ... or "*"]}``.

    :raises ValueError: a key is not ``uid:N`` or ``gid:N`` (the settings check this first).
    """

    def __init__(self, table: Mapping[str, Sequence[str]]) -> None:
        self._by_uid: dict[int, frozenset[str]] = {}
        self._by_gid: dict[int, frozenset[str]] = {}
        for key, tenants in table.items():
            match = RULE.match(key)
            if match is None:
                raise ValueError("a tenant_binding key is uid:N or gid:N")
            rules = self._by_uid if match.group(1) == "uid" else self._by_gid
            rules[int(match.group(2))] = frozenset(tenants)
        self.active = bool(table)

    def tenants_for(self, peer: Peer | None) -> frozenset[str]:
        """The tenants ``peer`` may use: its user's rule and its group's rule together."""
        if peer is None:
            return frozenset()
        return self._by_uid.get(peer.uid, frozenset()) | self._by_gid.get(peer.gid, frozenset())
