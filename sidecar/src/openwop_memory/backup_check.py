"""Whether the backup a sidecar reports is where the operator can see it.

The sidecar writes the file in its own view of the file system. Under a service manager
that view may differ from the operator's: systemd's ``PrivateTmp=`` gives the service a
``/tmp`` of its own (which also vanishes when it stops), a container has its own root. A
backup reported there is one nobody can restore from, so ``openwop-memory backup`` checks
from its own side and names the reason when the file is not there.
"""

from __future__ import annotations

import os
import socket
import struct
from typing import Any

# A destination that the sidecar and the operator both see under the shipped systemd unit
# (StateDirectory=, writable by the service, a path outside PrivateTmp=).
SHARED_DESTINATION = "/var/lib/openwop-memory/backups"
# What PrivateTmp= makes private (named, not used: nothing is written there).
_PRIVATE_TMP = ("/tmp/", "/var/tmp/")  # noqa: S108


def backup_unseen(result: dict[str, Any], admin_socket: str) -> str | None:
    """``None`` when the file ``result`` names (``path``) exists here with ``bytes`` bytes;
    otherwise one line saying where the sidecar wrote it and why it cannot be seen from here
    (another mount namespace, found through the admin socket's peer, or a file since
    removed or changed)."""
    path, size = str(result["path"]), int(result["bytes"])
    told = f"the sidecar reports a backup of {size} bytes at {path}, but "
    try:
        here = os.stat(path).st_size
    except FileNotFoundError:
        pass
    except OSError as exc:
        return f"{told}this command cannot check it: {exc.strerror}"
    else:
        if here == size:
            return None
        return f"{told}it has {here} bytes here: it changed after the backup; back up again"
    return f"{told}it does not exist here: {_why_unseen(path, admin_socket)}"


def _why_unseen(path: str, admin_socket: str) -> str:
    pid = _peer_pid(admin_socket)
    theirs = _mount_namespace(pid) if pid is not None else None
    ours = _mount_namespace(os.getpid())
    private_tmp = path.startswith(_PRIVATE_TMP)
    hint = (
        f"back up to a directory both see, such as {SHARED_DESTINATION} under the shipped "
        "systemd unit, or a mounted volume in a Pod"
    )
    if theirs is not None and ours is not None and theirs != ours:
        where = (
            "its /tmp is private to it (systemd's PrivateTmp=; the file goes when the service "
            "stops)"
            if private_tmp
            else "its file system is not this command's"
        )
        return f"the sidecar (pid {pid}) runs in another mount namespace: {where}; {hint}"
    if theirs is None:
        return (
            "the sidecar may run in another mount namespace (PrivateTmp=, a container), "
            f"which this command cannot tell; {hint}"
        )
    return "it was removed or moved after the backup"


def _peer_pid(admin_socket: str) -> int | None:
    """The pid of the process serving ``admin_socket`` (``SO_PEERCRED``), or None."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            s.connect(admin_socket)
            credentials = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    except (OSError, AttributeError):  # AttributeError: no SO_PEERCRED on this platform
        return None
    pid, _uid, _gid = struct.unpack("3i", credentials)
    return pid if pid > 0 else None


def _mount_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None
