"""Tenant binding (``tenant_binding``): the connecting process's user or group decides which
tenants it may name, for every method that names a tenant or a run.

Other users are real processes: a client started with ``setuid`` (the suite runs as root
here; those tests are skipped otherwise) on a socket in a directory every user can reach.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.sidecar import RawClient, Sidecar

# A Python another user may run (the test's own may live under a private directory).
OTHER_USERS_PYTHON = "/usr/bin/python3"

OTHER_UID = 4242
ALLOWED = "tenant-acme"
OTHER = "tenant-beta"


def binding(table: dict[str, list[str]]) -> tuple[str, str]:
    return "--tenant-binding", json.dumps(table)


def forbidden(client: RawClient, method: str, **params: Any) -> None:
    err = client.error(method, **params)
    assert err.code == "forbidden", err.error
    assert err.rpc_code == -32003


def test_a_peer_may_name_only_the_tenants_bound_to_its_user(workdir: Path) -> None:
    """Before: any process that could open the socket could name any tenant. Now, with
    ``tenant_binding = {"uid:<ours>": ["tenant-acme"]}``: refs and runs of that tenant
    work, another tenant is ``forbidden`` for ``memory.issueRef`` and ``run.begin``, and
    methods naming no tenant still answer."""
    args = binding({f"uid:{os.geteuid()}": [ALLOWED]})
    with Sidecar(workdir, *args) as sidecar, sidecar.client() as c:
        ref = c.call("memory.issueRef", tenant=ALLOWED, agent="a")["memoryRef"]
        c.call("run.begin", runId="bound-run", tenant=ALLOWED)
        c.call("memory.put", runId="bound-run", memoryRef=ref, entry={"content": "ok"})
        forbidden(c, "memory.issueRef", tenant=OTHER, agent="a")
        forbidden(c, "run.begin", runId="other-run", tenant=OTHER)
        assert c.call("sidecar.health")["status"] == "ok"
        assert "capabilities" in c.call("host.capabilities")
        stats = c.call("sidecar.stats")["requests"]
        assert stats["run.begin"]["forbidden"] == 1


def test_a_group_rule_with_a_star_allows_every_tenant(workdir: Path) -> None:
    """``{"gid:<ours>": ["*"]}``: every tenant, through the group rule alone."""
    args = binding({f"gid:{os.getegid()}": ["*"], "uid:1": [ALLOWED]})
    with Sidecar(workdir, *args) as sidecar, sidecar.client() as c:
        for tenant in (ALLOWED, OTHER):
            c.call("run.begin", runId=f"star-{tenant}", tenant=tenant)


def test_a_peer_matching_no_rule_may_use_no_tenant(workdir: Path) -> None:
    """A binding that does not name our user or group: every tenant is forbidden."""
    args = binding({"uid:1": ["*"]})
    with Sidecar(workdir, *args) as sidecar, sidecar.client() as c:
        forbidden(c, "run.begin", runId="nobody", tenant=ALLOWED)


def test_a_bad_binding_stops_start_up_naming_the_setting(workdir: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "openwop_memory",
            "serve",
            "--socket",
            str(workdir / "bad.sock"),
            "--database",
            f"sqlite:///{workdir / 'bad.db'}",
            "--tenant-binding",
            '{"user:bob": ["x"]}',
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1
    assert "tenant_binding" in proc.stderr


# -- two users on one sidecar ----------------------------------------------------------------

_AS_OTHER_USER = """
import json, socket, sys
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(sys.argv[1])
reader = sock.makefile("rb")
for i, (method, params) in enumerate(json.loads(sys.argv[2])):
    request = {"jsonrpc": "2.0", "id": i, "method": method, "params": params}
    sock.sendall(json.dumps(request).encode() + b"\\n")
    answer = json.loads(reader.readline())
    print(json.dumps(answer.get("error", {}).get("data", {}).get("error", "ok")))
"""


def as_other_user(socket_path: Path, calls: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Run ``calls`` on one connection from a process whose user is ``OTHER_UID``; the
    outcome of each (``ok`` or the error code)."""

    def drop_privileges() -> None:
        os.setgid(OTHER_UID)
        os.setuid(OTHER_UID)

    proc = subprocess.run(
        [OTHER_USERS_PYTHON, "-c", _AS_OTHER_USER, str(socket_path), json.dumps(calls)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        preexec_fn=drop_privileges,
    )
    return [json.loads(line) for line in proc.stdout.splitlines()]


@pytest.fixture
def shared_socket_dir() -> Iterator[Path]:
    """A directory every user can traverse, for a socket another user must reach."""
    directory = Path(tempfile.mkdtemp(prefix="owm-bind-"))
    directory.chmod(0o755)
    try:
        yield directory
    finally:
        for path in directory.iterdir():
            path.unlink()
        directory.rmdir()


@pytest.mark.skipif(
    os.geteuid() != 0 or not os.access(OTHER_USERS_PYTHON, os.X_OK),
    reason="starting another user's process needs root and a system Python",
)
def test_a_run_begun_under_a_tenant_is_usable_only_by_peers_allowed_that_tenant(
    workdir: Path, shared_socket_dir: Path
) -> None:
    """Root may use tenant-acme, user 4242 tenant-beta. A run root began under tenant-acme
    does not exist for user 4242: every method naming it (list, get, put, delete,
    addSecrets) answers ``not_found`` as for an id never used, and ``run.end`` ends
    nothing; the id is free for user 4242's own tenant, and root's run is untouched."""
    args = binding({f"uid:{os.geteuid()}": [ALLOWED], f"uid:{OTHER_UID}": [OTHER]})
    socket_path = shared_socket_dir / "memory.sock"
    with (
        Sidecar(workdir, *args, "--socket-mode", "0666", socket_path=socket_path) as sidecar,
        sidecar.client() as root,
    ):
        ref = root.call("memory.issueRef", tenant=ALLOWED, agent="a")["memoryRef"]
        root.call("run.begin", runId="acme-run", tenant=ALLOWED)
        entry = root.call("memory.put", runId="acme-run", memoryRef=ref, entry={"content": "x"})
        run_and_ref = {"runId": "acme-run", "memoryRef": "plain"}
        secret = {"id": "k", "value": "v" * 12}
        outcomes = as_other_user(
            socket_path,
            [
                ("memory.list", run_and_ref),
                ("memory.get", {**run_and_ref, "id": entry["id"]}),
                ("memory.put", {**run_and_ref, "entry": {"content": "y"}}),
                ("memory.delete", {**run_and_ref, "id": entry["id"]}),
                (
                    "run.addSecrets",
                    {"runId": "acme-run", "secrets": [secret]},
                ),
                ("run.end", {"runId": "acme-run"}),
                ("memory.issueRef", {"tenant": ALLOWED, "agent": "a"}),
                ("run.begin", {"runId": "acme-run", "tenant": OTHER}),
                ("run.begin", {"runId": "beta-run", "tenant": OTHER}),
                ("memory.issueRef", {"tenant": OTHER, "agent": "b"}),
                ("memory.list", {"runId": "never-begun", "memoryRef": "plain"}),
            ],
        )
        # The same answers as for an id nobody ever used: nothing tells the run exists.
        assert outcomes == ["not_found"] * 5 + ["ok", "forbidden"] + ["ok"] * 3 + ["not_found"]
        # Nothing of it changed: root's run is still open, and a run begun now sees the entry.
        root.call("memory.put", runId="acme-run", memoryRef=ref, entry={"content": "still"})
        root.call("run.begin", runId="acme-reader", tenant=ALLOWED)
        assert root.call("memory.get", runId="acme-reader", memoryRef=ref, id=entry["id"])
