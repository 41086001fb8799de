"""Requests, answers and errors on the wire, checked against PROTOCOL.md and its schemas.

Every helper talks to a real ``openwop-memory serve`` through a :class:`RawClient`; nothing is
mocked. The checking helpers (``checked_entry``, ``error_of``, ``expect``, ``put``, ...)
assert what they promise and raise AssertionError otherwise.
"""

from __future__ import annotations

import json
import re
from typing import Any

from support.names import uid
from support.schemas import check_entry, check_envelope
from support.sidecar import RawClient, RpcError, Sidecar

# PROTOCOL.md, Objects: RFC 3339 UTC, exactly six fractional digits, a `Z`.
WIRE_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$")
ENTRY_KEYS = {"id", "content", "tags", "createdAt", "expiresAt"}


def req(method: str, params: dict[str, Any] | None = None, rid: Any = 1) -> bytes:
    """One JSON-RPC request line (without its newline)."""
    msg: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
    if params is not None:
        msg["params"] = params
    return json.dumps(msg).encode()


def notification(method: str, params: dict[str, Any] | None = None) -> bytes:
    """One JSON-RPC notification line (no id, so no answer is due; without its newline)."""
    msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        msg["params"] = params
    return json.dumps(msg).encode()


def raw_answer(client: RawClient, line: bytes) -> bytes:
    """Send one line and return the raw answer line (bytes, newline included)."""
    client.send_line(line)
    answer = client.reader.readline()
    if not answer:
        raise EOFError("the sidecar closed the connection")
    return answer


def error_of(response: Any, code: str, rpc_code: int) -> RpcError:
    """The error of a response object, checked against the envelope schema and the codes."""
    assert isinstance(response, dict), response
    assert response.get("jsonrpc") == "2.0", response
    assert "result" not in response, response
    assert "error" in response, response
    check_envelope(response["error"])
    err = RpcError(response["error"])
    assert (err.code, err.rpc_code) == (code, rpc_code), response
    # The envelope repeats the JSON-RPC message's code family; details is always an object.
    assert isinstance(err.error["data"].get("details", {}), dict), response
    return err


def expect(client: RawClient, code: str, rpc_code: int, method: str, **params: Any) -> RpcError:
    """``method`` must fail with ``code``/``rpc_code``; the error object is schema-checked."""
    err = client.error(method, **params)
    check_envelope(err.error)
    assert (err.code, err.rpc_code) == (code, rpc_code), err.error
    return err


def invalid(client: RawClient, method: str, **params: Any) -> RpcError:
    """``method`` must fail with ``validation_error`` / -32602 (bad params)."""
    return expect(client, "validation_error", -32602, method, **params)


def assert_run_not_found(err: RpcError) -> None:
    """``err`` is a schema-valid ``not_found`` / -32004 whose ``details.resource`` is ``run``."""
    check_envelope(err.error)
    assert err.code == "not_found", err.error
    assert err.rpc_code == -32004, err.error
    assert err.details.get("resource") == "run", err.error


def checked_entry(entry: Any) -> dict[str, Any]:
    """A MemoryEntry as PROTOCOL.md spells it: the schema, its keys and its time format."""
    check_entry(entry)
    assert isinstance(entry, dict)
    assert set(entry) <= ENTRY_KEYS and {"id", "content", "tags", "createdAt"} <= set(entry)
    assert WIRE_TIME.match(entry["createdAt"]), entry
    if "expiresAt" in entry:
        assert WIRE_TIME.match(entry["expiresAt"]), entry
    return entry


def begin(client: RawClient, tenant: str = "t1", **params: Any) -> str:
    """Begin a fresh run of ``tenant``; returns its id."""
    run_id = uid("run")
    client.call("run.begin", runId=run_id, tenant=tenant, **params)
    return run_id


def put(client: RawClient, run_id: str, ref: str, content: str, **entry: Any) -> dict[str, Any]:
    """Put ``content`` (and the other ``entry`` fields) into ``ref``; the checked entry."""
    result = client.call(
        "memory.put", runId=run_id, memoryRef=ref, entry={"content": content, **entry}
    )
    return checked_entry(result)


def later_list(client: RawClient, ref: str, tenant: str = "t1", **options: Any) -> list[Any]:
    """What a run begun now sees in ``ref``."""
    run_id = begin(client, tenant)
    params: dict[str, Any] = {"runId": run_id, "memoryRef": ref}
    if options:
        params["options"] = options
    result = client.call("memory.list", **params)
    assert isinstance(result, list)
    for entry in result:
        checked_entry(entry)
    return result


def pipeline(client: RawClient, lines: list[bytes]) -> list[Any]:
    """Send all ``lines`` in one write, then read as many answer lines."""
    client.sock.sendall(b"".join(line + b"\n" for line in lines))
    return [client.read() for _ in lines]


def assert_healthy(sidecar: Sidecar) -> None:
    """The process is alive and a fresh connection gets a healthy answer."""
    assert sidecar.proc is not None and sidecar.proc.poll() is None, sidecar.log()[-2000:]
    with sidecar.client() as c:
        health = c.call("sidecar.health")
    assert health["status"] == "ok", health
    assert "internal_error" not in json.dumps(health)
