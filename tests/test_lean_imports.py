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
from openwop_memory.wire.jsonrpc_parts import (
    NOID,
    JsonRpcError,
    Left,
    Success,
    call,
    create_request,
    to_response,
)
from support.sidecar import unmeasured

pytestmark = pytest.mark.backend_independent

# Never needed to serve a request of a SQLite sidecar without a config file or secrets_dir.
NOT_AT_STARTUP = [
    "jsonschema",  # via jsonrpcserver's package __init__ (see wire/jsonrpc_parts.py)
    "jsonrpcserver.main",
    "http.server",  # jsonrpcserver's own HTTP server
    "tomllib",  # a config file only
    "openwop_memory.service.secrets_directory",  # secrets_dir only
    "openwop_memory.storage.postgresql",
    "openwop_memory_client._async_client",  # the client classes, not their errors and models
    "openwop_memory_client._sync_client",
    "openwop_memory_client._convert",
    "anyio.from_thread",
    # The search extra's model loads on the first put or relevance search, not at start.
    "numpy",
    "tokenizers",
    "safetensors",
    "openwop_memory.storage.vector_cache",
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
        "from openwop_memory import cli, logs, server\n"
        "from openwop_memory.app import open_app\n"
        "from openwop_memory.config import Settings\n"
        f"settings = Settings(database='sqlite:///{tmp_path}/memory.db')\n"
        "async def start():\n"
        "    async with await open_app(settings):\n"
        "        pass\n"
        "anyio.run(start)\n"
    )
    assert "openwop_memory.storage.sqlite" in loaded  # the probe did reach the server stack
    assert "openwop_memory.wire.jsonrpc_parts" in loaded
    assert [m for m in NOT_AT_STARTUP if m in loaded] == []


def test_the_health_probe_imports_only_the_standard_library() -> None:
    loaded = _modules_after("from openwop_memory import cli")
    heavy = {"pydantic", "anyio", "structlog", "orjson", "openwop_memory_client", "tomllib"}
    assert heavy.isdisjoint(m.split(".")[0] for m in loaded)


def test_jsonrpcserver_imported_normally_afterwards_is_whole() -> None:
    """The parts are loaded without leaving a half-made ``jsonrpcserver`` behind."""
    loaded = _modules_after(
        """
from openwop_memory.wire import jsonrpc_parts
assert "jsonrpcserver" not in sys.modules
import jsonrpcserver, jsonrpcserver.dispatcher
request = '{"jsonrpc": "2.0", "method": "ping", "id": 1}'
answer = jsonrpcserver.dispatch(request, methods={"ping": lambda: jsonrpcserver.Success(1)})
assert answer == '{"jsonrpc": "2.0", "result": 1, "id": 1}', answer
assert jsonrpcserver.dispatcher.create_request is not None
"""
    )
    assert "jsonschema" in loaded  # the normal import still validates, as it always did


def test_the_parts_of_an_already_imported_jsonrpcserver_are_its_own() -> None:
    _modules_after(
        "import jsonrpcserver\n"
        "from openwop_memory.wire import jsonrpc_parts as parts\n"
        "assert parts.Success is jsonrpcserver.Success\n"
        "assert parts.JsonRpcError is jsonrpcserver.JsonRpcError\n"
    )


@pytest.mark.anyio
async def test_the_parts_call_a_method_and_shape_its_answer() -> None:
    """What wire/dispatch.py relies on: ``call`` runs the method with the context first and
    the params as keywords; a ``JsonRpcError`` becomes a ``Left`` carrying its fields."""

    async def echo(ctx: str, /, **params: int) -> object:
        return Success({"ctx": ctx, **params})

    async def refuse(ctx: str, /, **params: int) -> object:
        raise JsonRpcError(-32602, "bad", {"error": "validation_error"})

    request = create_request({"jsonrpc": "2.0", "method": "m", "params": {"a": 1}, "id": 7})
    ok = to_response(request, await call(request, "c", echo))
    assert not isinstance(ok, Left)
    assert (ok._value.result, ok._value.id) == ({"ctx": "c", "a": 1}, 7)

    failed = to_response(request, await call(request, "c", refuse))
    assert isinstance(failed, Left)
    error = failed._error
    assert (error.code, error.message, error.data, error.id) == (
        -32602,
        "bad",
        {"error": "validation_error"},
        7,
    )

    notification = create_request({"jsonrpc": "2.0", "method": "m", "params": {}})
    assert notification.id is NOID


def test_settling_the_collector_freezes_and_raises_the_young_threshold() -> None:
    _modules_after(
        "import gc\n"
        "from openwop_memory import gcpolicy\n"
        "gc.set_threshold(700, 10, 10)\n"
        "gcpolicy.settle_after_startup()\n"
        "assert gc.get_freeze_count() > 1000, gc.get_freeze_count()\n"
        "assert gc.get_threshold() == (gcpolicy.YOUNG_THRESHOLD, 10, 10), gc.get_threshold()\n"
        "gc.set_threshold(0)\n"
        "gcpolicy.settle_after_startup()\n"
        "assert gc.get_threshold()[0] == 0  # a disabled collector stays disabled\n"
    )
