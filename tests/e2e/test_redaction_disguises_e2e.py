"""Disguised secrets end to end: through a real sidecar, down to the bytes of its files.

Every disguise of :data:`support.disguises.DISGUISES` of a few registered secrets is put in
the content, in a tag where a tag can hold it (at most 256 characters, no control
characters), and split across fields. Then the database file, its ``-wal`` and ``-shm``, and
the sidecar's log are searched, while it runs and after it stopped, for each secret in every
form a copy of it could take (:func:`support.disguises.encoded_forms`: raw, base64, hex,
percent-encoded, JSON-escaped, SHA-256, UTF-16, ...), for every verbatim fragment of it
with 12 letters and digits, and for each disguised text as it was sent: none may be there,
while the answers the client got carry the markers. The ``reject`` and ``reject-disguised``
redaction policies and the ``--credential-patterns`` policies are checked through the wire as well.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import pytest
from support.disguises import (
    DISGUISES,
    MIN_FRAGMENT_ALNUM,
    alnum_piece,
    encoded_forms,
    fake_key,
    public_prefix,
    split_across_fields,
)
from support.on_disk import entry_count, files_of
from support.protocol import leaked_ids, put_error, secrets_param
from support.schemas import check_entry
from support.sidecar import RawClient, RpcError, Sidecar

TENANT = "t-disguise"
REF = "notes"
# One key with a public prefix, one of hex digits only, one non-ASCII.
_rng = random.Random(1129)
SECRETS: dict[str, str] = {
    "gh": fake_key(_rng, "github"),
    "hex": fake_key(_rng, "hex40"),
    "intl": fake_key(_rng, "nonascii"),
}
# Sent with every entry, so that finding it in the database proves the scan sees content.
CONTENT_MARKER = "DISGUISE-CONTENT-7f3a"
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
MAX_TAG_CHARS = 256


# -- helpers -----------------------------------------------------------------------------------


def marker(secret_id: str) -> str:
    return f"[REDACTED:{secret_id}]"


def put_response(c: RawClient, run: str, content: str, tags: list[str]) -> dict[str, Any]:
    return c.request(
        "memory.put",
        {"runId": run, "memoryRef": REF, "entry": {"content": content, "tags": tags}},
    )


def needles_of(secret: str) -> dict[str, bytes]:
    """What must not be found of ``secret``: every encoded form, and every verbatim fragment
    of :data:`MIN_FRAGMENT_ALNUM` letters and digits beyond its public prefix (as UTF-8)."""
    needles = {f"form {name}": data for name, data in encoded_forms(secret).items()}
    for i in range(len(public_prefix(secret)), len(secret)):
        piece = alnum_piece(secret, i, MIN_FRAGMENT_ALNUM)
        if secret[i].isalnum() and piece:
            needles[f"fragment at {i}"] = piece.encode()
    return needles


def found_in(data: dict[str, bytes], needles: dict[str, bytes]) -> list[str]:
    """``"<needle> in <file>"`` for every needle found in any of ``data``."""
    return [
        f"{n} in {name}" for name, blob in data.items() for n, d in needles.items() if d in blob
    ]


def assert_no_secret_in(text: str, *secrets: str) -> None:
    """No form or fragment of any of ``secrets`` is in ``text`` (an error or an answer)."""
    blob = text.encode()
    for secret in secrets:
        hits = [name for name, data in needles_of(secret).items() if data in blob]
        assert not hits, f"{hits} of a secret in {text[:2000]}"


def taggable(text: str) -> bool:
    return len(text) <= MAX_TAG_CHARS and not _CONTROL.search(text)


# -- rewrite: every disguise, nothing on disk ----------------------------------------------------


@pytest.mark.sqlite_only
def test_no_form_of_a_secret_reaches_the_files_or_the_log(workdir: Path) -> None:
    problems: list[str] = []
    sent: dict[str, bytes] = {}  # disguised texts as sent, by a name for the report
    sidecar = Sidecar(workdir)
    with sidecar, sidecar.client() as c:
        c.call("run.begin", runId="writer", tenant=TENANT, secrets=secrets_param(**SECRETS))
        puts = 0
        for secret_id, secret in SECRETS.items():
            for name, disguise in DISGUISES.items():
                disguised = disguise(secret)
                if len(disguised) >= 16:  # shorter texts could occur by chance in a page
                    sent[f"{name} of {secret_id}"] = disguised.encode()
                in_tag = taggable(disguised)
                content = f"{CONTENT_MARKER} {name} 参照 {disguised} 完了"
                tags = [f"d:{name}", disguised] if in_tag else [f"d:{name}"]
                response = put_response(c, "writer", content, tags)
                puts += 1
                if "result" not in response:
                    problems.append(f"{name} of {secret_id}: {response.get('error')}")
                    continue
                entry = response["result"]
                check_entry(entry)
                if marker(secret_id) not in entry["content"]:
                    problems.append(f"{name} of {secret_id}: no marker in {entry['content']!r}")
                if in_tag and not any(marker(secret_id) in t for t in entry["tags"]):
                    problems.append(f"{name} of {secret_id}: no marker in {entry['tags']!r}")
                try:
                    assert_no_secret_in(json.dumps(response, ensure_ascii=False), secret)
                except AssertionError as exc:
                    problems.append(f"{name} of {secret_id}: in the answer: {exc}"[:400])

            # Split across content and tags, and across tags only, in pieces too short to be
            # fragments that count on their own.
            parts = -(-len(secret) // (MIN_FRAGMENT_ALNUM - 1))
            for in_content in (True, False):
                content, tags = split_across_fields(
                    secret, parts, before=f"{CONTENT_MARKER} split 参照 ", in_content=in_content
                )
                response = put_response(c, "writer", content, tags)
                puts += 1
                where = "content+tags" if in_content else "tags"
                if "result" not in response:
                    problems.append(f"split over {where} of {secret_id}: {response.get('error')}")
                    continue
                fields = [response["result"]["content"], *response["result"]["tags"]]
                if not any(marker(secret_id) in f for f in fields):
                    problems.append(f"split over {where} of {secret_id}: no marker in {fields}")

        # A later run reads everything back: markers, and nothing of any secret.
        c.call("run.begin", runId="reader", tenant=TENANT)
        view = c.call("memory.list", runId="reader", memoryRef=REF, options={"limit": 1000})
        assert len(view) == puts, (len(view), puts)
        listed = json.dumps(view, ensure_ascii=False)
        for secret_id in SECRETS:
            assert marker(secret_id) in listed
        needles = {
            f"{n} of {secret_id}": d
            for secret_id, secret in SECRETS.items()
            for n, d in needles_of(secret).items()
        }
        problems += [
            f"in the list answer: {hit}" for hit in found_in({"list": listed.encode()}, needles)
        ]

        running = files_of(workdir)
        assert any(name.endswith("-wal") and data for name, data in running.items()), running.keys()
        # Positive control: the scan does see stored content.
        assert any(CONTENT_MARKER.encode() in d for n, d in running.items() if ".db" in n)
        problems += [f"while running: {hit}" for hit in found_in(running, needles)]
        problems += [f"while running: {hit} (as sent)" for hit in found_in(running, sent)]
    assert sidecar.proc is not None and sidecar.proc.returncode == 0

    stopped = files_of(workdir)
    assert any(n.endswith(".db") for n in stopped), stopped.keys()
    problems += [f"after stop: {hit}" for hit in found_in(stopped, needles)]
    problems += [f"after stop: {hit} (as sent)" for hit in found_in(stopped, sent)]
    logs = {n: d for n, d in stopped.items() if n.endswith(".log")}
    assert logs and all(logs.values())
    problems += [f"log: {hit}" for hit in found_in(logs, {"content": CONTENT_MARKER.encode()})]
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(sorted(set(problems))[:60])


# -- reject and reject-disguised --------------------------------------------------------------

# Disguises the policy tests send: the raw value and a few kinds of disguise.
POLICY_DISGUISES = ["raw", "base64", "fullwidth", "spaced", "hex_lower", "zero_width_space"]


def leaked(err: RpcError, *secrets: str) -> list[str]:
    """The ids a ``secret_leakage`` error names (see :func:`support.protocol.leaked_ids`);
    it shows none of ``secrets`` in any of their forms."""
    assert_no_secret_in(json.dumps(err.error, ensure_ascii=False), *secrets)
    return leaked_ids(err, CONTENT_MARKER)


@pytest.mark.sqlite_only
def test_reject_refuses_every_form_and_stores_nothing(workdir: Path) -> None:
    with Sidecar(workdir, "--redaction", "reject") as s, s.client() as c:
        c.call("run.begin", runId="w", tenant=TENANT, secrets=secrets_param(**SECRETS))
        for secret_id, secret in SECRETS.items():
            for name in POLICY_DISGUISES:
                disguised = DISGUISES[name](secret)
                assert secret_id in leaked(
                    put_error(c, "w", REF, f"{CONTENT_MARKER} {disguised} end"), secret
                ), name
                assert secret_id in leaked(
                    put_error(c, "w", REF, "clean", ["ok", disguised]), secret
                )
            content, tags = split_across_fields(secret, 4, before=f"{CONTENT_MARKER} ")
            assert secret_id in leaked(put_error(c, "w", REF, content, tags), secret)
        assert entry_count(s.database) == 0
        log = s.log().encode()
    for secret in SECRETS.values():
        assert not found_in({"log": log}, needles_of(secret))
    assert CONTENT_MARKER.encode() not in log


@pytest.mark.sqlite_only
def test_reject_disguised_rewrites_the_raw_value_and_refuses_a_disguise(workdir: Path) -> None:
    with Sidecar(workdir, "--redaction", "reject-disguised") as s, s.client() as c:
        c.call("run.begin", runId="w", tenant=TENANT, secrets=secrets_param(**SECRETS))
        stored = 0
        for secret_id, secret in SECRETS.items():
            # The verbatim value: an honest mistake, rewritten and stored.
            response = put_response(c, "w", f"{CONTENT_MARKER} {secret} end", [secret])
            assert "result" in response, response
            assert response["result"]["content"] == f"{CONTENT_MARKER} {marker(secret_id)} end"
            assert response["result"]["tags"] == [marker(secret_id)]
            stored += 1
            # A disguise: evidence of intent, refused, and nothing stored.
            for name in [n for n in POLICY_DISGUISES if n != "raw"]:
                disguised = DISGUISES[name](secret)
                if disguised == secret:
                    continue  # e.g. fullwidth of a value without ASCII (not the case here)
                err = put_error(c, "w", REF, f"{CONTENT_MARKER} {disguised} end")
                assert secret_id in leaked(err, secret), name
            content, tags = split_across_fields(secret, 4, before=f"{CONTENT_MARKER} ")
            assert secret_id in leaked(put_error(c, "w", REF, content, tags), secret)
            # Raw in one field and disguised in another: refused as a whole.
            encoded = DISGUISES["base64"](secret)
            assert secret_id in leaked(put_error(c, "w", REF, f"{secret} {encoded}"), secret)
        assert entry_count(s.database) == stored
        c.call("run.begin", runId="r", tenant=TENANT)
        view = c.call("memory.list", runId="r", memoryRef=REF)
        assert len(view) == stored
        assert_no_secret_in(json.dumps(view, ensure_ascii=False), *SECRETS.values())
        log = s.log().encode()
    for secret in SECRETS.values():
        assert not found_in({"log": log}, needles_of(secret))


# -- credential patterns ------------------------------------------------------------------------


def _unregistered_credentials() -> dict[str, str]:
    """Random strings in two well-known credential formats; no run registers them."""
    rng = random.Random(77)
    upper = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
    return {"github": fake_key(rng, "github"), "aws": "AKIA" + "".join(rng.choices(upper, k=16))}


PATTERN_MARKER = re.compile(r"\[REDACTED:pattern:[a-z0-9-]+\]")


@pytest.mark.sqlite_only
@pytest.mark.parametrize("policy", ["rewrite", "reject", "off"])
def test_credential_patterns_policy(workdir: Path, policy: str) -> None:
    creds = _unregistered_credentials()
    registered = SECRETS["gh"]  # itself credential-shaped: registered ids take precedence
    with Sidecar(workdir, "--credential-patterns", policy) as s, s.client() as c:
        c.call("run.begin", runId="w", tenant=TENANT, secrets=secrets_param(gh=registered))
        expected_rows = 0
        for name, cred in creds.items():
            content = f"{CONTENT_MARKER} {name} key {cred} end"
            response = put_response(c, "w", content, [f"k:{cred}"])
            if policy == "reject":
                assert "error" in response, response
                ids = leaked(RpcError(response["error"]), cred)
                assert ids and all(i.startswith("pattern:") for i in ids), ids
                continue
            assert "result" in response, response
            expected_rows += 1
            entry = response["result"]
            if policy == "off":
                assert (entry["content"], entry["tags"]) == (content, [f"k:{cred}"])
            else:
                assert cred not in json.dumps(entry), entry
                assert PATTERN_MARKER.search(entry["content"]), entry
                assert PATTERN_MARKER.search(entry["tags"][0]), entry

        # Whatever the pattern policy, a registered secret is rewritten under its own id.
        response = put_response(c, "w", f"{CONTENT_MARKER} mine {registered} end", [])
        assert "result" in response, response
        assert response["result"]["content"] == f"{CONTENT_MARKER} mine {marker('gh')} end"
        expected_rows += 1
        assert entry_count(s.database) == expected_rows
        files = files_of(workdir)
    for name, cred in creds.items():
        hits = found_in(files, {name: cred.encode()})
        assert (not hits) if policy != "off" else hits, hits
    assert not found_in(files, {"registered": registered.encode()})
