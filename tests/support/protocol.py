"""Requests, answers and errors on the wire, checked against PROTOCOL.md and its schemas.

Every helper talks to a real ``openwop-memory serve`` through a :class:`RawClient`; nothing is
mocked. The checking helpers (``checked_entry``, ``error_of``, ``expect``, ``put``, ...)
assert what they promise and raise AssertionError otherwise.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from typing import Any

from openwop_memory_client.wire import VENDOR_FILTER

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


def assert_resolves_to_nothing(client: RawClient, run: str, ref: str, entry_ids: list[str]) -> None:
    """``ref`` (malformed, or a tampered issued ref) resolves to nothing for ``run``, a run
    open in this sidecar: ``list`` is empty (plain, by tag, limited), ``get`` of each of
    ``entry_ids`` is null, ``delete`` false, and ``put`` a validation_error on memoryRef."""
    for options in ({}, {"options": {"tag": "t"}}, {"options": {"limit": 5}}):
        assert client.call("memory.list", runId=run, memoryRef=ref, **options) == [], ref
    for entry_id in entry_ids:
        assert client.call("memory.get", runId=run, memoryRef=ref, id=entry_id) is None, ref
        assert client.call("memory.delete", runId=run, memoryRef=ref, id=entry_id) is False, ref
    err = invalid(client, "memory.put", runId=run, memoryRef=ref, entry={"content": "nope"})
    assert err.details.get("field") == "memoryRef", (ref, err.error)


def checked_entry(entry: Any) -> dict[str, Any]:
    """A MemoryEntry as PROTOCOL.md spells it: the schema, its keys and its time format."""
    check_entry(entry)
    assert isinstance(entry, dict)
    assert set(entry) <= ENTRY_KEYS and {"id", "content", "tags", "createdAt"} <= set(entry)
    assert WIRE_TIME.match(entry["createdAt"]), entry
    if "expiresAt" in entry:
        assert WIRE_TIME.match(entry["expiresAt"]), entry
    return entry


TENANT = "t1"
"""The tenant of the helpers below unless told another."""


def secrets_param(**by_id: str) -> list[dict[str, str]]:
    """``run.begin``'s ``secrets``: ``secrets_param(k=V)`` is ``[{"id": "k", "value": V}]``."""
    return [{"id": k, "value": v} for k, v in by_id.items()]


def begin(client: RawClient, run: str, tenant: str = TENANT, **params: Any) -> dict[str, Any]:
    """``run.begin`` of ``run`` for ``tenant`` (with ``secrets``, ``replay``, ...); its result,
    checked to be ``{runId, tenant, snapshotAt, resumed}`` for that run."""
    result = client.call("run.begin", runId=run, tenant=tenant, **params)
    assert isinstance(result, dict), result
    assert set(result) == {"runId", "tenant", "snapshotAt", "resumed"}, result
    assert (result["runId"], result["tenant"]) == (run, tenant), result
    assert WIRE_TIME.match(result["snapshotAt"]), result
    assert isinstance(result["resumed"], bool), result
    return result


def new_run(client: RawClient, tenant: str = TENANT, **params: Any) -> str:
    """Begin a run of ``tenant`` under a name no test used before; its id."""
    run_id = uid("run")
    assert begin(client, run_id, tenant, **params)["resumed"] is False
    return run_id


def issue(
    client: RawClient, tenant: str = TENANT, agent: str = "agent", namespace: str | None = None
) -> str:
    """The memoryRef ``memory.issueRef`` gives the scope (``tenant``, ``agent``, ``namespace``)."""
    params = {"tenant": tenant, "agent": agent}
    if namespace is not None:
        params["namespace"] = namespace
    result = client.call("memory.issueRef", **params)
    assert isinstance(result, dict) and set(result) == {"memoryRef"}, result
    ref = result["memoryRef"]
    assert isinstance(ref, str) and 0 < len(ref) <= 512, result
    return ref


def issue_refs(client: RawClient, count: int, tenant: str = TENANT) -> list[str]:
    """Refs of ``count`` scopes of ``tenant``, one per agent ``agent-0``, ``agent-1``, ..."""
    return [issue(client, tenant, f"agent-{n}") for n in range(count)]


_B64URL = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


def tampered(ref: str) -> list[str]:
    """Refs that look issued like ``ref`` but fail verification: every one-character change
    after the prefix, cuts, appendages, and the prefix alone or with garbage."""
    prefix = ref.index(".") + 1
    variants = []
    for i in range(prefix, len(ref)):
        ch = ref[i]
        replacement = _B64URL[(_B64URL.index(ch) + 1) % 64] if ch in _B64URL else "A"
        variants.append(ref[:i] + replacement + ref[i + 1 :])
    variants += [ref[:-1], ref[:-2], ref[:-4], ref[: prefix + 10], ref.rstrip("=")]
    variants += [ref + "A", ref + "AAAA", ref + "==", ref + "====", ref + "x", ref + " "]
    variants += [ref + "/", ref[:prefix], ref[:prefix] + "garbage"]
    return [v for v in dict.fromkeys(variants) if v != ref]


def entry_of(
    content: str, tags: list[str] | None = None, expires_at: str | None = None
) -> dict[str, Any]:
    """A ``memory.put`` entry: ``content``, and ``tags`` and ``expiresAt`` when given."""
    entry: dict[str, Any] = {"content": content}
    if tags is not None:
        entry["tags"] = tags
    if expires_at is not None:
        entry["expiresAt"] = expires_at
    return entry


def put(
    client: RawClient,
    run: str,
    ref: str,
    content: str,
    tags: list[str] | None = None,
    *,
    expires_at: str | None = None,
    **params: Any,
) -> dict[str, Any]:
    """Put an entry into ``ref`` (``params``: ``idempotencyKey``); the entry, checked."""
    entry = entry_of(content, tags, expires_at)
    return checked_entry(client.call("memory.put", runId=run, memoryRef=ref, entry=entry, **params))


def put_error(
    client: RawClient,
    run: str,
    ref: str,
    content: str,
    tags: list[str] | None = None,
    *,
    expires_at: str | None = None,
    **params: Any,
) -> RpcError:
    """The error a put of that entry must fail with, its envelope checked; AssertionError
    if the put succeeded."""
    entry = entry_of(content, tags, expires_at)
    err = client.error("memory.put", runId=run, memoryRef=ref, entry=entry, **params)
    check_envelope(err.error)
    return err


def leaked_ids(err: RpcError, *never_shown: str) -> list[str]:
    """``err`` is ``secret_leakage`` (-32010), its envelope checked, naming secret ids and
    showing none of ``never_shown``; the ids."""
    check_envelope(err.error)
    assert (err.code, err.rpc_code) == ("secret_leakage", -32010), err.error
    for text in (json.dumps(err.error), json.dumps(err.error, ensure_ascii=False)):
        for needle in never_shown:
            assert needle not in text, (needle, text)
    ids = err.details.get("secretIds")
    assert isinstance(ids, list) and ids and all(isinstance(i, str) for i in ids), err.error
    return ids


def listing(client: RawClient, run: str, ref: str, **options: Any) -> list[dict[str, Any]]:
    """What ``run`` sees in ``ref`` (``options``: ``limit``, ``tag``), every entry checked."""
    params: dict[str, Any] = {"runId": run, "memoryRef": ref}
    if options:
        params["options"] = options
    result = client.call("memory.list", **params)
    assert isinstance(result, list), result
    return [checked_entry(entry) for entry in result]


def list_all(client: RawClient, run: str, ref: str) -> list[dict[str, Any]]:
    """Every entry ``run`` sees in ``ref``, newest first: pages of ``memory.list`` (at most
    1000 entries, and at most ``max_answer_bytes`` of them), each read on from the last
    entry's ``createdAt``, until a page brings nothing new. Entries of one commit can share
    a ``createdAt``, so each page reads from 1 µs after it and skips the ids already read.
    Unchecked, so that thousands of entries cost nothing; callers compare them with what
    ``put`` returned (and checked)."""
    entries: dict[str, dict[str, Any]] = {}
    options: dict[str, Any] = {"limit": 1000}
    while True:
        page = client.call("memory.list", runId=run, memoryRef=ref, options=options)
        assert isinstance(page, list), page
        new = [entry for entry in page if entry["id"] not in entries]
        if not new:
            return list(entries.values())
        entries.update((entry["id"], entry) for entry in new)
        last = datetime.fromisoformat(page[-1]["createdAt"].replace("Z", "+00:00"))
        before = (last + timedelta(microseconds=1)).isoformat()
        options = {"limit": 1000, VENDOR_FILTER: {"createdBefore": before}}


def get(client: RawClient, run: str, ref: str, entry_id: str) -> dict[str, Any] | None:
    """The entry ``entry_id`` of ``ref`` as ``run`` sees it (checked), or None."""
    result = client.call("memory.get", runId=run, memoryRef=ref, id=entry_id)
    return None if result is None else checked_entry(result)


def delete(client: RawClient, run: str, ref: str, entry_id: str) -> bool:
    """``memory.delete``'s answer: whether a live entry was deleted."""
    result = client.call("memory.delete", runId=run, memoryRef=ref, id=entry_id)
    assert isinstance(result, bool), result
    return result


def later_list(
    client: RawClient, ref: str, tenant: str = TENANT, *, run: str | None = None, **options: Any
) -> list[dict[str, Any]]:
    """What a run begun now (``run``, or one of a fresh name) sees in ``ref``."""
    if run is None:
        run = new_run(client, tenant)
    else:
        begin(client, run, tenant)
    return listing(client, run, ref, **options)


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
