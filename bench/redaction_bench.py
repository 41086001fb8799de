"""The redaction benchmark: :func:`redact_entry` measured in process, no sidecar.

Every put pays for one redaction of its content and tags against the run's keyring, so the
redactor's cost is added latency on every write. Measured, with the keyring compiled once
outside the timing (the sidecar compiles it once per keyring change, not per put):

- throughput in MB/s (10^6 UTF-8 bytes per second) of 64 KiB entries holding no secret (the
  common case) for keyrings of 1, 10 and 100 secrets, on ASCII text (a fixed sample of the
  standard library's source files) and on non-ASCII text (the same source interleaved with
  Cyrillic, Greek, CJK and Arabic prose): the median of ``passes`` passes over the corpus;
- added latency per put for entries of 1 KiB (with three tags) and 64 KiB, 10 secrets, p50
  and p99 over ``samples`` puts;
- the worst case: a 64 KiB entry dense with disguised secrets (base64 alone and inside
  blobs, hex, escapes, percent-encoding, separators, fullwidth forms, zero-width characters,
  fragments, nested encodings), p50 and p99 over repeated runs of that one entry, and how
  many secrets its result still holds (must be none);
- the CPU per byte of 64 KiB entries of the costliest shapes (credential anchors, escapes
  standing apart, nested encodings) against a benign 64 KiB entry's, as ratios;
- how long compiling a keyring of 10 and of 100 secrets takes (informational);
- CPU µs per entry of the common put: a 200-300 byte note with no secret (short English
  phrases, two tags), against the two secrets of a run and against an empty keyring with
  credential patterns on (the default), each by :func:`redact_entry` (which takes its
  shortcut) and by :func:`redact_in_full` (the full search, what every entry cost before
  the shortcut), in alternating batches of one run; and the share of those entries that
  took the shortcut (must be all).

Targets: at least 20 MB/s on ASCII text with 10 secrets; p99 of a 1 KiB put at most 0.5 ms;
p50 of the 64 KiB worst case at most 30 ms (one fixed input: its median is its cost, its
p99 mostly the machine's noise); no hostile shape above 30 times a benign byte's CPU
(50 before issue 20); a no-hit note at most 5 µs of CPU ("a few µs").
"""

from __future__ import annotations

import base64
import gc
import gzip
import random
import statistics
import sysconfig
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from openwop_memory.redaction.keyring import FIELD_SEPARATOR
from openwop_memory.redaction.redact import (
    EMPTY_KEYRING,
    Keyring,
    PatternPolicy,
    Redacted,
    nothing_to_find,
    redact_entry,
    redact_in_full,
)

from bench.report import Metric, SuiteResult, Target
from bench.sidecar_bench import percentile

ENTRY_CHARS = 64 << 10  # the default max_entry_size_bytes
SMALL_ENTRY_CHARS = 1 << 10
SMALL_ENTRY_TAGS = ("source:bench", "topic:redaction", "kind:note")
KEYRING_SIZES = (1, 10, 100)
LATENCY_SECRETS = 10
_URLSAFE = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
# Real words in other scripts (ruff's RUF001 flags their letters as look-alikes of Latin).
_PROSE = (
    "Быстрая коричневая лиса перепрыгивает через ленивую собаку, а память агента растёт.",  # noqa: RUF001
    "Η γρήγορη καφέ αλεπού πηδά πάνω από τον τεμπέλη σκύλο και γράφει σημειώσεις.",  # noqa: RUF001
    "敏捷的棕色狐狸跳过了懒狗。记忆条目已保存,计划的下一步需要合并。",
    "素早い茶色の狐がのろまな犬を飛び越える。レビューの後にデプロイする。",
    "الثعلب البني السريع يقفز فوق الكلب الكسول، والملاحظة محفوظة في الذاكرة.",
)


# The common put: a short note of plain phrases, numbered, with two tags.
NOTE_TAGS = ("bench", "group:17")
NOTE_CHARS = (200, 300)
_NOTE_PHRASES = (
    "the user prefers concise answers",
    "deploy after the review of the draft",
    "budget for the project is fixed",
    "meeting moved to thursday afternoon",
    "keep the tone friendly but brief",
    "the staging database was migrated",
    "remember to cite the design doc",
    "tests must pass before merging",
    "the customer asked for a summary",
    "use metric units in every report",
)
NOTE_SECRETS = 2  # a run's secrets


@dataclass(frozen=True)
class RedactionBenchConfig:
    corpus_bytes: int = 4 << 20  # of each of the ASCII and the non-ASCII text
    passes: int = 3  # throughput passes over the corpus; the median counts
    small_samples: int = 3000  # 1 KiB puts
    large_samples: int = 200  # 64 KiB puts
    worst_samples: int = 30  # runs of the worst-case entry
    warmup: int = 20  # unmeasured 1 KiB puts first
    worst_warmup: int = 1
    note_batches: int = 60  # batches of each redactor over the notes; the median counts
    note_batch: int = 250  # notes per batch
    seed: int = 20261129

    @classmethod
    def quick(cls) -> RedactionBenchConfig:
        """Small sizes for a smoke run: a few seconds in all."""
        return cls(
            corpus_bytes=256 << 10,
            passes=1,
            small_samples=200,
            large_samples=10,
            worst_samples=3,
            worst_warmup=0,
            note_batches=8,
            note_batch=100,
        )


def _stdlib_dir() -> Path:
    system = Path("/usr/lib/python3.11")
    return system if system.is_dir() else Path(sysconfig.get_path("stdlib"))


def ascii_source(limit: int) -> str:
    """Pure-ASCII standard library source files up to ``limit`` bytes, drawn in a fixed
    pseudo-random order of the sorted paths: a sample of the whole library for any
    ``limit``, so quick and full runs measure the same mix (sorted order alone would give a
    small run only ``__future__`` .. ``_pydecimal`` and a large one whole codec tables)."""
    root = _stdlib_dir()
    paths = sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix())
    random.Random(0).shuffle(paths)
    parts: list[str] = []
    total = 0
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if not text.isascii():
            continue
        parts.append(text)
        total += len(text)
        if total >= limit:
            break
    if total < limit:  # a stripped-down Python: repeat what there is
        parts = parts * (limit // max(1, total) + 1)
    return "".join(parts)[:limit]


def mixed_text(rng: random.Random, limit: int) -> str:
    """Standard library source with a paragraph of non-ASCII prose every few lines, cut to
    ``limit`` UTF-8 bytes (roughly half of them outside ASCII)."""
    lines = ascii_source(limit).splitlines(keepends=True)
    out: list[str] = []
    size = 0
    for i, line in enumerate(lines):
        out.append(line)
        size += len(line)
        if i % 4 == 3:
            prose = " ".join(rng.choices(_PROSE, k=2)) + "\n"
            out.append(prose)
            size += len(prose.encode())
        if size >= limit:
            break
    return "".join(out)


def fake_keys(rng: random.Random, count: int) -> dict[str, str]:
    """``count`` random values shaped like real keys (generated here, never real), by id."""

    def pick(alphabet: str, n: int) -> str:
        return "".join(rng.choices(alphabet, k=n))

    makers: list[Callable[[], str]] = [
        lambda: "sk-proj-" + pick(_URLSAFE, 48),
        lambda: "ghp_" + pick(_URLSAFE[:62], 36),
        lambda: pick("0123456789abcdef", 40),
        lambda: base64.b64encode(rng.randbytes(24)).decode(),
        lambda: rng.randbytes(16).hex(),
        lambda: f"pässwörd-ключ-{rng.randint(1000, 9999)}!",
        lambda: "xoxb-" + pick("0123456789", 12) + "-" + pick(_URLSAFE[:62], 24),
    ]
    return {f"key-{i}": makers[i % len(makers)]() for i in range(count)}


def chunks(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def _disguises(secret: str, rng: random.Random) -> Iterator[str]:
    """The disguised forms the worst-case entry is made of, for one secret."""
    raw = secret.encode()
    yield base64.b64encode(raw).decode()
    blob = rng.randbytes(rng.randint(10, 40)) + raw + rng.randbytes(rng.randint(10, 40))
    yield base64.b64encode(blob).decode()
    yield raw.hex()
    yield "".join(f"\\u{ord(c):04x}" for c in secret)
    yield "".join(f"%{b:02X}" for b in raw)
    yield " ".join(secret)
    yield secret[3:18]  # a fragment
    yield "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in secret)
    yield "\u200b".join(secret)
    yield "".join(f"&#{ord(c)};" for c in secret)
    yield base64.b64encode(base64.b64encode(raw)).decode()
    yield base64.b64encode(gzip.compress(raw, mtime=0)).decode()
    yield "".join(f"={b:02X}" if i % 2 else chr(b) for i, b in enumerate(raw) if b < 128)


def worst_case_entry(keys: dict[str, str], rng: random.Random, chars: int) -> str:
    """``chars`` characters dense with disguises of ``keys``, a few words of prose between."""
    out: list[str] = []
    size = 0
    while size < chars:
        for secret in keys.values():
            for form in _disguises(secret, rng):
                piece = f"{form} note {rng.randint(0, 999)}; "
                out.append(piece)
                size += len(piece)
    return "".join(out)[:chars]


def _timed(keyring: Keyring, content: str, tags: tuple[str, ...]) -> float:
    start = time.perf_counter()
    redact_entry(keyring, content, tags, patterns="rewrite")
    return time.perf_counter() - start


def throughput(keyring: Keyring, entries: list[str], passes: int) -> float:
    """MB/s over ``entries`` (UTF-8 bytes), the median of ``passes`` passes."""
    total_bytes = sum(len(e.encode()) for e in entries)
    seconds = []
    for _ in range(passes):
        gc.collect()
        seconds.append(sum(_timed(keyring, e, ()) for e in entries))
    return total_bytes / statistics.median(seconds) / 1e6


def latencies(
    keyring: Keyring, entries: list[str], tags: tuple[str, ...], samples: int, warmup: int
) -> list[float]:
    """Sorted per-put times in seconds, cycling through ``entries``."""
    for i in range(warmup):
        _timed(keyring, entries[i % len(entries)], tags)
    gc.collect()
    return sorted(_timed(keyring, entries[i % len(entries)], tags) for i in range(samples))


def plain_notes(rng: random.Random, count: int) -> list[str]:
    """``count`` numbered notes of :data:`NOTE_CHARS` characters made of plain phrases."""
    out = []
    for i in range(count):
        size = rng.randint(*NOTE_CHARS)
        text = f"#{i}"
        while len(text) < size:
            text += " " + rng.choice(_NOTE_PHRASES) + ","
        out.append(text[:size])
    return out


Redactor = Callable[..., Redacted]


def _cpu_us(
    redact: Redactor, keyring: Keyring, entries: list[str], patterns: PatternPolicy
) -> float:
    """CPU µs per entry of one pass of ``redact`` over ``entries`` (this thread's time: on a
    shared machine, other processes' work does not count)."""
    start = time.thread_time_ns()
    for entry in entries:
        redact(keyring, entry, NOTE_TAGS, patterns=patterns)
    return (time.thread_time_ns() - start) / len(entries) / 1000


def note_costs(
    keyring: Keyring, entries: list[str], patterns: PatternPolicy, config: RedactionBenchConfig
) -> tuple[float, float]:
    """Median CPU µs per note of :func:`redact_entry` and of :func:`redact_in_full`, measured
    in alternating batches (each going first in half of them), so drift affects both alike."""
    size = config.note_batch
    batches = [entries[i : i + size] for i in range(0, len(entries), size)]
    for batch in batches[:2]:  # warm both paths' caches
        _cpu_us(redact_entry, keyring, batch, patterns)
        _cpu_us(redact_in_full, keyring, batch, patterns)
    gc.collect()
    short: list[float] = []
    full: list[float] = []
    for i in range(config.note_batches):
        batch = batches[i % len(batches)]
        pair = ((redact_entry, short), (redact_in_full, full))
        for redact, out in pair if i % 2 else pair[::-1]:
            out.append(_cpu_us(redact, keyring, batch, patterns))
    return statistics.median(short), statistics.median(full)


def _note_metrics(rng: random.Random, config: RedactionBenchConfig) -> list[Metric]:
    entries = plain_notes(rng, 4 * config.note_batch)
    run_keys = fake_keys(random.Random(config.seed + NOTE_SECRETS), NOTE_SECRETS)
    cases = (
        (f"{NOTE_SECRETS} secrets", Keyring.compile({v: k for k, v in run_keys.items()})),
        ("empty keyring", EMPTY_KEYRING),
    )
    metrics: list[Metric] = []
    for label, keyring in cases:
        shortcut, full = note_costs(keyring, entries, "rewrite", config)
        name = f"redaction no-hit note, {label}"
        metrics.append(Metric(f"{name}, CPU", shortcut, "µs", Target("<=", 5)))
        metrics.append(Metric(f"{name}, full search, CPU", full, "µs"))
        taken = sum(
            nothing_to_find(keyring, FIELD_SEPARATOR.join((e, *NOTE_TAGS)), True) for e in entries
        )
        metrics.append(
            Metric(f"{name}, shortcut taken", 100 * taken / len(entries), "%", Target("==", 100))
        )
    return metrics


# Shapes that cost the most per byte (issue 20, row 3), each a 64 KiB entry of nothing but:
HOSTILE_SHAPES = {
    "credential anchors (SK)": "SK",
    "anchors of many formats": "SKeyJxox://:AAhf_shpdapi_v1_",
    "lookback anchors (T3BlbkFJ)": "T3BlbkFJ",
    "escapes apart (\\x41 )": "\\x41 ",
    "nested percent (%2541)": "%2541",
    "mixed escapes": "%41\\x42&#67;=44\\u0045 ",
    "base64 words": "QUJDREVGR0hJSktM ",
}


def _cpu_ms(keyring: Keyring, text: str, repeats: int) -> float:
    """Median CPU ms of :func:`redact_entry` of ``text`` (this thread's CPU time), each
    time with different first characters, so that no cache on the way (the decoder's of
    short escapes) makes a repeat cheaper than a new entry."""
    samples = []
    for i in range(repeats):
        variant = f"{i:04d}" + text[4:]
        start = time.thread_time()
        redact_entry(keyring, variant, ())
        samples.append((time.thread_time() - start) * 1000)
    return statistics.median(samples)


def _hostile_metrics(keyring: Keyring, benign: str, repeats: int) -> list[Metric]:
    """CPU per byte of each hostile shape against a benign 64 KiB entry (source text, which
    takes the full search), as a ratio: a machine's speed cancels out."""
    base = _cpu_ms(keyring, benign, repeats) / len(benign.encode())
    metrics = []
    ratios = []
    for name, unit in HOSTILE_SHAPES.items():
        text = (unit * (ENTRY_CHARS // len(unit) + 1))[:ENTRY_CHARS]
        ratio = _cpu_ms(keyring, text, repeats) / len(text.encode()) / base
        ratios.append(ratio)
        metrics.append(Metric(f"redaction CPU per byte, {name} / benign", ratio, "x"))
    # Before issue 20 the anchors alone cost 50 times the benign entry; escapes cost 17-25.
    metrics.append(
        Metric("redaction CPU per byte, worst / benign", max(ratios), "x", Target("<=", 30))
    )
    return metrics


def _compile_ms(keys: dict[str, str]) -> float:
    start = time.perf_counter()
    Keyring.compile({v: k for k, v in keys.items()})
    return (time.perf_counter() - start) * 1000


def measure(config: RedactionBenchConfig) -> SuiteResult:
    rng = random.Random(config.seed)
    keyrings = {n: fake_keys(random.Random(config.seed + n), n) for n in KEYRING_SIZES}
    compiled = {n: Keyring.compile({v: k for k, v in keys.items()}) for n, keys in keyrings.items()}
    texts = {
        "ASCII": ascii_source(config.corpus_bytes),
        "non-ASCII": mixed_text(rng, config.corpus_bytes),
    }
    metrics: list[Metric] = []
    notes: list[str] = []

    for kind, text in texts.items():
        entries = chunks(text, ENTRY_CHARS)
        for n in KEYRING_SIZES:
            rate = throughput(compiled[n], entries, config.passes)
            plural = "secret" if n == 1 else "secrets"
            target = Target(">=", 20) if (kind, n) == ("ASCII", 10) else None
            metrics.append(
                Metric(f"redaction throughput, {kind}, {n} {plural}", rate, "MB/s", target)
            )

    keyring = compiled[LATENCY_SECRETS]
    ascii_text = texts["ASCII"]
    small = chunks(ascii_text, SMALL_ENTRY_CHARS)[:512]
    times = latencies(keyring, small, SMALL_ENTRY_TAGS, config.small_samples, config.warmup)
    for q, target in ((0.50, None), (0.99, Target("<=", 0.5))):
        metrics.append(
            Metric(
                f"redaction 1 KiB put p{round(q * 100)}, {LATENCY_SECRETS} secrets",
                percentile(times, q) * 1000,
                "ms",
                target,
            )
        )
    large = chunks(ascii_text, ENTRY_CHARS)
    times = latencies(keyring, large, SMALL_ENTRY_TAGS, config.large_samples, 2)
    for q in (0.50, 0.99):
        metrics.append(
            Metric(
                f"redaction 64 KiB put p{round(q * 100)}, {LATENCY_SECRETS} secrets",
                percentile(times, q) * 1000,
                "ms",
            )
        )

    keys = keyrings[LATENCY_SECRETS]
    worst = worst_case_entry(keys, rng, ENTRY_CHARS)
    times = latencies(keyring, [worst], (), config.worst_samples, config.worst_warmup)
    for q, target in ((0.50, Target("<=", 30)), (0.99, None)):
        metrics.append(
            Metric(
                f"redaction 64 KiB worst case p{round(q * 100)}, {LATENCY_SECRETS} secrets",
                percentile(times, q) * 1000,
                "ms",
                target,
            )
        )
    result = redact_entry(keyring, worst, (), patterns="rewrite")
    left = sum(result.content.count(secret) for secret in keys.values())
    metrics.append(Metric("redaction worst case: raw secrets left", left, "count", Target("==", 0)))
    notes.append(
        f"redaction worst case: {sum(len(f.secret_ids) for f in result.findings)} secret ids "
        f"found, {result.content.count('[REDACTED:')} markers in {len(worst):,} characters"
    )

    metrics.extend(_hostile_metrics(keyring, large[0], min(config.worst_samples, 5)))
    for n in (10, 100):
        metrics.append(Metric(f"keyring compile, {n} secrets", _compile_ms(keyrings[n]), "ms"))
    metrics.extend(_note_metrics(random.Random(config.seed), config))
    return SuiteResult(metrics, notes)


async def run(config: RedactionBenchConfig) -> SuiteResult:
    """The suite, for ``bench/run.py``. It runs on the event loop's thread on purpose: it is
    CPU-bound and nothing else runs meanwhile, and a thread hand-off would only add noise."""
    return measure(config)
