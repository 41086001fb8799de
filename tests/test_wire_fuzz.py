"""Property tests of the wire layer: whatever a client sends, the answer is a well-formed
JSON-RPC response (or nothing, for a notification), and an error is always the contract's
envelope, never ``internal_error``.

These drive the real dispatcher over a real SQLite file in process (hypothesis needs
thousands of cases; a subprocess per case would take minutes).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openwop_memory.app import open_app
from openwop_memory.config import Settings
from openwop_memory.wire.dispatch import Dispatcher
from support.backends import selected
from support.schemas import check_entry, check_envelope

pytestmark = pytest.mark.anyio

METHODS = [
    "host.capabilities",
    "memory.issueRef",
    "run.begin",
    "run.addSecrets",
    "run.end",
    "memory.list",
    "memory.get",
    "memory.put",
    "memory.delete",
    "sidecar.health",
    "sidecar.stats",
]
PARAM_NAMES = [
    "runId",
    "tenant",
    "agent",
    "namespace",
    "memoryRef",
    "id",
    "entry",
    "options",
    "secrets",
    "replay",
    "idempotencyKey",
    "content",
    "tags",
    "limit",
    "tag",
]

json_scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(PARAM_NAMES) | st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
params = st.dictionaries(st.sampled_from(PARAM_NAMES), json_values, max_size=5)
requests = st.fixed_dictionaries(
    {"jsonrpc": st.just("2.0"), "method": st.sampled_from(METHODS), "params": params},
    optional={"id": st.integers(0, 1000) | st.text(max_size=5)},
)


@pytest.fixture
async def dispatcher(tmp_path: Path) -> AsyncIterator[Dispatcher]:
    settings = Settings.model_validate({"database": selected().url_for(tmp_path / "fuzz.db")})
    async with await open_app(settings) as app:
        # One open run, so that memory.* requests naming it get past the run lookup.
        await app.dispatcher.handle_line(
            b'{"jsonrpc":"2.0","id":0,"method":"run.begin","params":{"runId":"r","tenant":"t"}}'
        )
        yield app.dispatcher


def check_answer(answer: Any, request: Any) -> None:
    assert isinstance(answer, dict), answer
    assert answer["jsonrpc"] == "2.0"
    assert ("result" in answer) != ("error" in answer)
    if "error" in answer:
        check_envelope(answer["error"])
        assert answer["error"]["data"]["error"] != "internal_error", answer
    if isinstance(request, dict) and "id" in request and "error" not in answer:
        assert answer["id"] == request["id"]


FUZZ = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@FUZZ
@given(request=requests)
async def test_any_request_gets_a_contract_answer(dispatcher: Dispatcher, request: Any) -> None:
    for run_id in (None, "r"):  # with and without a run that exists
        if run_id is not None and request["params"].get("runId") is not None:
            request["params"]["runId"] = run_id
        line = await dispatcher.handle_line(orjson.dumps(request))
        if "id" not in request:
            assert line is None
            continue
        assert line is not None
        assert line.endswith(b"\n")
        answer = json.loads(line)
        check_answer(answer, request)
        if request["method"] == "memory.put" and "result" in answer:
            check_entry(answer["result"])


@FUZZ
@given(payload=json_values)
async def test_any_json_line_gets_a_contract_answer(dispatcher: Dispatcher, payload: Any) -> None:
    line = await dispatcher.handle_line(orjson.dumps(payload))
    if line is None:  # only a notification, or a batch of them, goes unanswered
        assert isinstance(payload, (dict, list))
        return
    answer = json.loads(line)
    for one in answer if isinstance(answer, list) else [answer]:
        check_answer(one, None)


@FUZZ
@given(raw=st.binary(max_size=64))
async def test_any_bytes_get_a_contract_answer(dispatcher: Dispatcher, raw: bytes) -> None:
    line = await dispatcher.handle_line(raw)
    if line is not None:
        answer = json.loads(line)
        for one in answer if isinstance(answer, list) else [answer]:
            check_answer(one, None)
