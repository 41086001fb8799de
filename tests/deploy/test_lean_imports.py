"""Start-up imports only what serving requests needs (idle memory and start-to-ready).

Each check runs in a fresh interpreter, since this test process has imported everything.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.sidecar import unmeasured

pytestmark = pytest.mark.backend_independent

# Never needed to serve a request of a SQLite sidecar without a config file or secrets_dir.
NOT_AT_STARTUP = [
    "jsonschema",  # (jsonrpcserver's import made it; the sidecar no longer uses it)
    "jsonrpcserver",  # the JSON-RPC layer is owned (see wire/dispatch.py's docstring)
    "oslash",
    "tomllib",  # a config file only
    "openwop_memory.service.secrets_directory",  # secrets_dir only
    "openwop_memory.storage.postgresql.backend",
    "openwop_memory.storage.postgresql.factory",
    "openwop_memory_client._async_client",  # the client classes, not their errors and models
    "openwop_memory_client._sync_client",
    "openwop_memory_client._convert",
    "anyio.from_thread",
    # The search extra's model loads on the first put or relevance search, not at start.
    "numpy",
    "tokenizers",
    "safetensors",
    "threadpoolctl",
    "openwop_memory.retrieval.nearest",
    # The [mcp] extra is installed in the test venv: `openwop-memory mcp` alone imports it.
    "openwop_memory.mcp_server",
    "mcp",
    "mcp_types",
    "starlette",
    "uvicorn",
    "langgraph",  # the client's [langgraph] extra: the store only
    "openwop_memory_client.langgraph_store",
]


def _modules_after(code: str) -> set[str]:
    """``sys.modules`` of a fresh interpreter after running ``code``. The interpreter is not
    measured for coverage (``make test``), whose start-up would import modules of its own."""
    probe = f"import sys\n{code}\nprint(sorted(sys.modules))\n"
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=unmeasured(os.environ),
    )
    assert done.returncode == 0, done.stderr
    return set(ast.literal_eval(done.stdout.splitlines()[-1]))


def test_serving_imports_nothing_only_other_paths_need(tmp_path: Path) -> None:
    """What the server imports, plus what opening its components on a SQLite file adds."""
    loaded = _modules_after(
        "import anyio\n"
        "from openwop_memory import logs, server\n"
        "from openwop_memory.cli import main\n"
        "from openwop_memory.app import open_app\n"
        "from openwop_memory.config import Settings\n"
        f"settings = Settings(database='sqlite:///{tmp_path}/memory.db')\n"
        "async def start():\n"
        "    async with await open_app(settings):\n"
        "        pass\n"
        "anyio.run(start)\n"
    )
    assert "openwop_memory.storage.sqlite.backend" in loaded  # the probe did reach the server stack
    assert "openwop_memory.wire.dispatch" in loaded
    assert [m for m in NOT_AT_STARTUP if m in loaded] == []


def test_the_health_probe_imports_only_the_standard_library() -> None:
    loaded = _modules_after("from openwop_memory.cli import main")
    heavy = {"pydantic", "anyio", "structlog", "orjson", "openwop_memory_client", "tomllib"}
    assert heavy.isdisjoint(m.split(".")[0] for m in loaded)
