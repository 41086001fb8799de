"""A sidecar serving a ``memory://`` database (the in-memory backend): the protocol works
on it, and the commands that would need another process to reach it (export, import)
refuse it with a clear message. The service's rules on that backend are
``tests/service/test_service_clock.py``'s, run over both stores."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.backends import BACKENDS
from support.protocol import issue, list_all, new_run, put
from support.sidecar import Sidecar, run_cli

pytestmark = pytest.mark.backend_independent


def test_a_sidecar_serves_a_memory_database_that_other_commands_cannot_reach(
    workdir: Path,
) -> None:
    backend = BACKENDS["memory"]
    with Sidecar(workdir, backend=backend) as sidecar, sidecar.client() as client:
        health = client.call("sidecar.health")
        assert health["status"] == "ok" and health["storage"]["backend"] == "memory"
        ref = issue(client)
        writer = new_run(client)
        put(client, writer, ref, "held in the sidecar's memory")
        reader = new_run(client)
        assert [e["content"] for e in list_all(client, reader, ref)] == [
            "held in the sidecar's memory"
        ]
        for command in ("export", "import"):
            done = run_cli(
                command,
                str(workdir / "memory.ndjson"),
                "--database",
                backend.url_for(sidecar.database),
            )
            assert done.returncode == 1
            assert "memory:// database lives only in the process that serves it" in done.stderr
        assert not (workdir / "memory.ndjson").exists()
