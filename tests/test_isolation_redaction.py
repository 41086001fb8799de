"""Issue 20, row 3: what an entry costs to redact is bounded per byte whatever it holds,
and one client's costly puts do not starve another client.

Before: a 64 KiB entry of credential-pattern anchors (``"SK" * 32000``) cost 25 times a
benign put's redaction; 64 such puts took 22 s, and another client's ``sidecar.health``
waited up to 4.7 s meanwhile (the redactions ran in up to 40 threads, each holding the GIL
against the event loop).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from openwop_memory.redaction.credential_patterns import credential_attempts, find_credentials
from openwop_memory.redaction.decode import escape_views
from support.sidecar import RawClient, Sidecar

TENANT = "tenant-redaction-cost"
ENTRY_CHARS = 60_000
TWILIO = "SK" + "0123456789abcdef" * 2  # the shape of a Twilio API key
# The costliest shapes measured (bench/redaction_bench.py prints their cost per byte).
HOSTILE = (
    "SK" * (ENTRY_CHARS // 2),
    "\\x41 " * (ENTRY_CHARS // 5),
    "%2541" * (ENTRY_CHARS // 5),
    "SKeyJxox://:AAhf_shpdapi_v1_" * (ENTRY_CHARS // 28),
)
# What every bystander call must answer within, on a loaded CI machine.
BYSTANDER_BOUND_S = 1.0


def _hostile(n: int) -> str:
    """The ``n``th hostile entry, a real credential at its end."""
    return HOSTILE[n % len(HOSTILE)] + " " + TWILIO


def test_a_burst_of_anchor_floods_leaves_a_bystander_served(tmp_path: Path) -> None:
    """One connection pipelines 96 puts of 60 KB built from the costliest shapes (anchors,
    escapes apart from each other, nested percent-encoding), each ending with a Twilio key.
    Another connection calls ``sidecar.health`` throughout: every call answers within 1 s
    (2.8 s before, 0.13 s after, measured), and every put is stored with the key redacted
    (none refused)."""
    puts = 96
    sidecar = Sidecar(tmp_path, "--log-level", "error")
    with sidecar, sidecar.client(timeout=120) as attacker, sidecar.client(timeout=30) as bystander:
        ref = attacker.call("memory.issueRef", tenant=TENANT, agent="a")["memoryRef"]
        attacker.call("run.begin", runId="flood", tenant=TENANT)
        bystander.call("sidecar.health")
        waits: list[float] = []
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                started = time.monotonic()
                bystander.call("sidecar.health")
                waits.append(time.monotonic() - started)
                time.sleep(0.01)

        watcher = threading.Thread(target=watch)
        lines = b"".join(
            json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": n,
                    "method": "memory.put",
                    "params": {
                        "runId": "flood",
                        "memoryRef": ref,
                        "entry": {"content": _hostile(n)},
                    },
                }
            ).encode()
            + b"\n"
            for n in range(puts)
        )
        watcher.start()
        try:
            attacker.sock.sendall(lines)
            answers = [attacker.read() for _ in range(puts)]
        finally:
            done.set()
            watcher.join()
        _check_stored(attacker, ref, answers)
    assert len(waits) >= 5, f"the bystander made only {len(waits)} calls"
    assert max(waits) <= BYSTANDER_BOUND_S, f"a health call waited {max(waits):.2f} s"


def _check_stored(client: RawClient, ref: str, answers: list[dict[str, object]]) -> None:
    errors = [a["error"] for a in answers if "error" in a]
    assert not errors, errors[:3]
    client.call("run.begin", runId="check", tenant=TENANT)
    for answer in answers:
        result = answer["result"]
        assert isinstance(result, dict)
        entry = client.call("memory.get", runId="check", memoryRef=ref, id=result["id"])
        assert TWILIO not in entry["content"]
        assert entry["content"].endswith("[REDACTED:pattern:twilio-api-key]")


def test_credential_search_tries_at_most_one_regex_per_anchor() -> None:
    """The credential search's work, counted: at most one regex try per anchor occurrence
    and format, so at most one per character for a text of two-character anchors, and
    none at all for text without anchors. Before, each hit of a format with a lookback
    could cost one try per character of the lookback (24 for the OpenAI key's)."""
    for text in HOSTILE:
        assert credential_attempts(text) <= len(text)
    legacy_openai = "T3BlbkFJ" * (ENTRY_CHARS // 8)
    assert credential_attempts(legacy_openai) <= len(legacy_openai) // 8
    assert credential_attempts("plain prose " * 5000) == 0
    # And the search is still exact: a key among the anchors is found, the anchors are not.
    text = HOSTILE[0] + " " + TWILIO
    assert find_credentials(text) == [(len(text) - len(TWILIO), len(text), "twilio-api-key")]


def test_escapes_apart_from_each_other_are_read_in_few_views() -> None:
    """Each decoded view is searched on its own, at a fixed cost per search: 12,000
    escapes each standing apart (``"\\x41 " * 12000``) made 12,000 views. Now views closer
    than 256 characters are one: at most one view per 256 characters."""
    text = "\\x41 " * (ENTRY_CHARS // 5)
    views = list(escape_views(text, 0, lambda s, e: True, lambda s, e: (0, 1 << 62)))
    assert 1 <= len(views) <= len(text) // 256 + 1
    assert all("A" in view.text for view in views)
