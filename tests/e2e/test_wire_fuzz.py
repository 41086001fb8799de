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
from openwop_memory.wire.dispatch import _METHODS, Dispatcher
from support.backends import selected
from support.schemas import check_entry, check_envelope

pytestmark = pytest.mark.anyio

# Every method the workers' socket serves, from the dispatcher's own table: a method added
# there is fuzzed (and must be given a well-formed call below) without editing this list.
METHODS = sorted(_METHODS)
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


def expected_id(request: Any) -> Any:
    """The id an answer to ``request`` carries: its own when it has a valid one (a string or
    an integer), else null (JSON-RPC 2.0, PROTOCOL.md)."""
    rid = request.get("id") if isinstance(request, dict) else None
    return rid if isinstance(rid, str | int) and not isinstance(rid, bool) else None


def is_notification(request: Any) -> bool:
    """A well-formed request object without an id: the one kind no answer is due to."""
    return (
        isinstance(request, dict)
        and request.keys() <= {"jsonrpc", "method", "params"}
        and request.get("jsonrpc") == "2.0"
        and isinstance(request.get("method"), str)
        and isinstance(request.get("params", {}), dict)
    )


def check_answer(answer: Any, request: Any) -> None:
    """``answer`` is the contract's response to ``request``: a result or an error envelope
    (never ``internal_error``), with the request's id."""
    assert isinstance(answer, dict), answer
    assert answer.keys() in ({"jsonrpc", "id", "result"}, {"jsonrpc", "id", "error"}), answer
    assert answer["jsonrpc"] == "2.0"
    assert answer["id"] == expected_id(request), (answer, request)
    if "error" in answer:
        check_envelope(answer["error"])
        assert answer["error"]["data"]["error"] != "internal_error", answer


def check_line(line: bytes | None, payload: Any) -> None:
    """``line`` is what is due for the parsed JSON ``payload``: nothing for a notification
    or a batch of them only; for a batch, one answer per other request; for anything else,
    one answer."""
    if isinstance(payload, list) and payload:
        due = [r for r in payload if not is_notification(r)]
        if not due:
            assert line is None, line
            return
        assert line is not None and line.endswith(b"\n"), payload
        answers = json.loads(line)
        assert isinstance(answers, list) and len(answers) == len(due), (answers, payload)
        # Answers carry ids, not positions: compare the ids as a multiset.
        ids = sorted(json.dumps(a.get("id")) for a in answers)
        assert ids == sorted(json.dumps(expected_id(r)) for r in due), (answers, payload)
        for answer in answers:
            check_answer(answer, next(r for r in due if expected_id(r) == answer["id"]))
        return
    if is_notification(payload):
        assert line is None, line
        return
    assert line is not None and line.endswith(b"\n"), payload
    check_answer(json.loads(line), payload)


def test_the_oracle_knows_notifications() -> None:
    """The checks above, on the cases the generated ones rarely hit."""
    note = {"jsonrpc": "2.0", "method": "sidecar.health", "params": {}}
    assert is_notification(note) and is_notification({"jsonrpc": "2.0", "method": "x"})
    assert not is_notification({**note, "id": None})
    assert not is_notification({**note, "params": []})
    assert not is_notification({**note, "extra": 1})
    assert not is_notification([note])
    assert [expected_id({"id": v}) for v in (1, "a", None, True, 1.5, [1])] == [1, "a"] + [None] * 4


FUZZ = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


async def test_each_method_answers_a_well_formed_request(dispatcher: Dispatcher) -> None:
    """The dispatcher the fuzzing below drives serves every method, so its answers are not
    all refusals: a result for each, with the request's id (``run.end`` last)."""
    secret = {"id": "k", "value": "12345678"}
    calls: dict[str, dict[str, Any]] = {
        "host.capabilities": {},
        "sidecar.health": {},
        "sidecar.stats": {},
        "sidecar.metrics": {},
        "memory.issueRef": {"tenant": "t", "agent": "a"},
        "run.begin": {"runId": "r", "tenant": "t"},
        "run.addSecrets": {"runId": "r", "secrets": [secret]},
        "memory.put": {"runId": "r", "memoryRef": "n", "entry": {"content": "c 12345678"}},
        "memory.list": {"runId": "r", "memoryRef": "n"},
        "memory.get": {"runId": "r", "memoryRef": "n", "id": "mem_none"},
        "memory.delete": {"runId": "r", "memoryRef": "n", "id": "mem_none"},
        "memory.getKey": {"runId": "r", "memoryRef": "n", "key": "k"},
        "memory.history": {"runId": "r", "memoryRef": "n", "key": "k"},
        "memory.page": {"runId": "r", "memoryRef": "n"},
        "memory.count": {"runId": "r", "memoryRef": "n"},
        "memory.search": {"runId": "r", "memoryRef": "n", "query": "c"},
        "memory.changes": {"tenant": "t"},
        "run.end": {"runId": "r"},
    }
    assert sorted(calls) == sorted(METHODS)
    for n, (method, params) in enumerate(calls.items()):
        request = {"jsonrpc": "2.0", "id": f"m{n}", "method": method, "params": params}
        line = await dispatcher.handle_line(orjson.dumps(request))
        assert line is not None, method
        answer = json.loads(line)
        check_answer(answer, request)
        assert "result" in answer, answer
        if method == "memory.put":
            check_entry(answer["result"])
            assert answer["result"]["content"] == "c [REDACTED:k]"


@FUZZ
@given(request=requests)
async def test_any_request_gets_a_contract_answer(dispatcher: Dispatcher, request: Any) -> None:
    for run_id in (None, "r"):  # with and without a run that exists
        if run_id is not None and request["params"].get("runId") is not None:
            request["params"]["runId"] = run_id
        line = await dispatcher.handle_line(orjson.dumps(request))
        check_line(line, request)
        answer = json.loads(line) if line is not None else None
        if request["method"] == "memory.put" and answer and "result" in answer:
            check_entry(answer["result"])


@FUZZ
@given(payload=json_values)
async def test_any_json_line_gets_a_contract_answer(dispatcher: Dispatcher, payload: Any) -> None:
    check_line(await dispatcher.handle_line(orjson.dumps(payload)), payload)


@FUZZ
@given(raw=st.binary(max_size=64))
async def test_any_bytes_get_a_contract_answer(dispatcher: Dispatcher, raw: bytes) -> None:
    line = await dispatcher.handle_line(raw)
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError:
        assert line is not None, raw  # not JSON: a parse error, with a null id
        answer = json.loads(line)
        check_answer(answer, None)
        assert answer["error"]["code"] == -32700, answer
        return
    check_line(line, payload)
