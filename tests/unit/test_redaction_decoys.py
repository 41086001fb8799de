"""No false positives: text that holds no secret comes back byte for byte unchanged.

The corpus is built at test time (at least 4 MB): Python standard library source read in
sorted order, random base64, base32 and hex blobs of many lengths, text that is encoded or
escaped but secret-free (base64 of prose, gzip+base64 of source, ``\\uXXXX``, ``&#NN;``,
``%HH``), decoys that share a public prefix with real key formats but not their length or
alphabet, digests and UUIDs, and non-ASCII prose (Cyrillic, Greek, CJK, Arabic, emoji
sequences, combining marks, fullwidth forms, zero-width characters inside words). A keyring
of 20 realistic random keys is active and credential patterns are on (``rewrite``): every
64 KiB chunk, as content and cut into tags of at most 256 characters, must come back
unchanged with no findings.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import random
import sysconfig
import uuid
from functools import cache
from pathlib import Path

import pytest
from openwop_memory.redaction import Keyring, Redacted, redact_entry
from support.disguises import fake_keys

pytestmark = pytest.mark.backend_independent

SEED = 4_2026_11_29
MIN_CORPUS_BYTES = 4 << 20
STDLIB_BYTES = 3 << 20
CHUNK_CHARS = 64 << 10
TAG_CHARS = 256
TAGS_PER_ENTRY = 16

_SYSTEM_STDLIB = Path("/usr/lib/python3.11")
STDLIB = _SYSTEM_STDLIB if _SYSTEM_STDLIB.is_dir() else Path(sysconfig.get_path("stdlib"))

# Standard library files left out because they hold a real credential-shaped string that the
# pattern detector rightly flags (relative to STDLIB). None so far.
EXCLUDED_FILES: frozenset[str] = frozenset()

KEYS = fake_keys(random.Random(SEED + 1), 20)  # not the corpus seed: no shared draws
KEYRING = Keyring.compile({value: secret_id for secret_id, value in KEYS.items()})

_ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


def stdlib_blocks(limit: int = STDLIB_BYTES) -> list[str]:
    """Whole ``.py`` files of the standard library, in sorted path order, until ``limit``
    UTF-8 bytes; files that are not valid UTF-8 are skipped (a few tests ship some)."""
    blocks, total = [], 0
    for path in sorted(STDLIB.rglob("*.py"), key=lambda p: p.relative_to(STDLIB).as_posix()):
        if path.relative_to(STDLIB).as_posix() in EXCLUDED_FILES or "site-packages" in path.parts:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        blocks.append(text)
        total += len(text.encode())
        if total >= limit:
            break
    return blocks


def blob_blocks(rng: random.Random) -> list[str]:
    """Random bytes as base64 (standard, URL-safe, with and without padding, wrapped at 76
    and 64 columns), base32 and hex (both cases), of lengths from 8 bytes to 6 KiB."""
    blocks = []
    lengths = [8, 9, 10, 12, 16, 20, 24, 30, 32, 33, 40, 48, 64, 100, 256, 1000, 4096, 6144]
    for round_ in range(12):
        for n in lengths:
            data = rng.randbytes(n)
            std = base64.b64encode(data).decode()
            url = base64.urlsafe_b64encode(data).decode()
            forms = [
                std,
                std.rstrip("="),
                url,
                url.rstrip("="),
                "\n".join(std[i : i + 76] for i in range(0, len(std), 76)),
                "\n".join(std[i : i + 64] for i in range(0, len(std), 64)),
                base64.b32encode(data).decode(),
                data.hex(),
                data.hex().upper(),
            ]
            form = forms[(round_ + n) % len(forms)]
            blocks.append(f"payload {round_}/{n} = {form!s}\n")
    return blocks


def encoded_text_blocks(rng: random.Random, source: list[str]) -> list[str]:
    """Secret-free text under the encodings and escapes the redactor decodes."""
    blocks = []
    for i in range(400):
        text = source[i % len(source)]
        start = rng.randrange(max(1, len(text) - 400))
        snippet = text[start : start + rng.randint(20, 400)]
        raw = snippet.encode()
        match i % 8:
            case 0:
                blocks.append(base64.b64encode(raw).decode())
            case 1:
                blocks.append(base64.b64encode(gzip.compress(raw, mtime=0)).decode())
            case 2:
                blocks.append("".join(f"\\u{ord(c):04x}" for c in snippet if ord(c) <= 0xFFFF))
            case 3:
                blocks.append("".join(f"&#{ord(c)};" for c in snippet))
            case 4:
                blocks.append("".join(f"%{b:02X}" for b in raw))
            case 5:
                blocks.append(json.dumps(snippet, ensure_ascii=True))
            case 6:
                blocks.append(base64.b64encode(base64.b64encode(raw)).decode())
            case _:
                blocks.append(raw.hex())
    return blocks


def prefix_decoys(rng: random.Random) -> list[str]:
    """Strings that share a public prefix with a real key format, but not its length or
    alphabet, in the prose a worker would write."""

    def rand(n: int, alphabet: str = _ALNUM) -> str:
        return "".join(rng.choices(alphabet, k=n))

    lines = []
    for i in range(300):
        decoys = [
            "sk-proj-abc",
            f"sk-proj-{rand(20)}",
            f"sk-{rand(10)}",
            f"ghp_{rand(10)}",
            f"ghp_{rand(35)}",
            f"AKIA{rand(16, 'abcdefghijklmnopqrstuvwxyz')}",
            f"AKIA{rand(15, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ234567')}",
            f"xoxb-{rand(3)}",
            "xoxb-123",
            "eyJhbGciOiJIUzI1NiJ9",
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0",
            f"AIza{rand(20)}",
            f"sk_live_{rand(10)}",
            f"glpat-{rand(10)}",
            f"github_pat_{rand(10)}",
            f"hf_{rand(10)}",
            f"npm_{rand(12)}",
            f"SG.{rand(5)}",
            "-----BEGIN PUBLIC KEY-----",
            f"sha256:{hashlib.sha256(rng.randbytes(16)).hexdigest()}",
            f"id {uuid.UUID(bytes=rng.randbytes(16))}",
            f"Bearer {rand(6)}",
        ]
        lines.append(f"decoy {i}: {decoys[i % len(decoys)]} (not a key)\n")
    return lines


# Deliberately full of look-alikes and compatibility forms (hence the noqa): prose, not keys.
_PROSE = [
    "Быстрая коричневая лиса перепрыгивает через ленивую собаку; ключ не найден.",
    "Η γρήγορη καφέ αλεπού πηδά πάνω από τον τεμπέλη σκύλο — κωδικός: κανένας.",  # noqa: RUF001
    "敏捷的棕色狐狸跳过了懒狗。记忆条目已保存,没有秘密。",
    "素早い茶色の狐がのろまな犬を飛び越える。設定を確認してください。",
    "الثعلب البني السريع يقفز فوق الكلب الكسول، لا توجد كلمة مرور هنا.",
    "Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich.",
    "Ｆｕｌｌｗｉｄｔｈ ｔｅｘｔ ｉｓ ｆｉｎｅ ｔｏｏ，ｎｏｔｈｉｎｇ ｓｅｃｒｅｔ。",  # noqa: RUF001
    "Family: 👨\u200d👩\u200d👧\u200d👦, flags 🇫🇷🇯🇵, skin 👍🏽, keycap 1\ufe0f\u20e3.",
    "Zero\u200bwidth\u200bspaces and soft\u00adhyphens and a \ufeffBOM inside words.",
    "Combining: e\u0301 a\u0308 n\u0303 o\u0336 Z\u0337\u0338\u0339 and precomposed é ä ñ.",
    "Mixed: pаypal with a Cyrillic а, Ωmega, ﬁligree ligature, ℌilbert, ① ② ③.",  # noqa: RUF001
]


def prose_blocks(rng: random.Random) -> list[str]:
    """Paragraphs of non-ASCII prose, sentences drawn at random."""
    return [" ".join(rng.choices(_PROSE, k=rng.randint(3, 12))) + "\n" for _ in range(2500)]


@cache
def corpus() -> str:
    rng = random.Random(SEED)
    source = stdlib_blocks()
    blocks = [
        *source,
        *blob_blocks(rng),
        *encoded_text_blocks(rng, source),
        *prefix_decoys(rng),
        *prose_blocks(rng),
    ]
    rng.shuffle(blocks)  # so that every chunk mixes kinds of text
    return "\n".join(blocks)


def chunks(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def _describe(original: tuple[str, tuple[str, ...]], result: Redacted) -> str:
    """Where a chunk changed: its findings, and the original text at the first difference."""
    sent = [original[0], *original[1]]
    got = [result.content, *result.tags]
    for field, (a, b) in enumerate(zip(sent, got, strict=True)):
        if a != b:
            at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), 0)
            return f"field {field} at {at}: {a[max(0, at - 80) : at + 120]!r} {result.findings}"
    return f"findings {result.findings}"


def test_the_corpus_is_big_and_varied_enough() -> None:
    text = corpus()
    assert len(text.encode()) >= MIN_CORPUS_BYTES, len(text.encode())
    assert "def " in text and "Быстрая" in text and "\u200b" in text and "sk-proj-abc" in text
    for value in KEYS.values():  # it really holds none of the keys
        assert value not in text


def test_no_chunk_of_the_corpus_is_changed_as_content() -> None:
    changed = []
    for n, chunk in enumerate(chunks(corpus(), CHUNK_CHARS)):
        result = redact_entry(KEYRING, chunk, (), patterns="rewrite")
        if result.content != chunk or result.findings or result.leaked:
            changed.append(f"chunk {n}: {_describe((chunk, ()), result)}")
    assert not changed, "\n".join(changed[:20])


def test_no_chunk_of_the_corpus_is_changed_as_tags() -> None:
    changed = []
    for n, chunk in enumerate(chunks(corpus(), CHUNK_CHARS)[::3]):
        for m, group in enumerate(chunks(chunk, TAG_CHARS * TAGS_PER_ENTRY)):
            tags = tuple(chunks(group, TAG_CHARS))
            result = redact_entry(KEYRING, "", tags, patterns="rewrite")
            if result.tags != tags or result.findings or result.leaked:
                changed.append(f"chunk {n * 3}/{m}: {_describe(('', tags), result)}")
    assert not changed, "\n".join(changed[:20])


def test_a_decompression_bomb_is_decoded_only_up_to_the_budget() -> None:
    # 60 MiB of one byte, gzipped and base64-encoded: a 64 KiB entry, returned unchanged;
    # a secret gzipped inside a large but ordinary log is still found.
    bomb = base64.b64encode(gzip.compress(b"A" * (60 << 20), mtime=0)).decode()[:65000]
    result = redact_entry(KEYRING, bomb, (), patterns="rewrite")
    assert (result.content, result.findings, result.leaked) == (bomb, (), False)
    secret_id, secret = next(iter(KEYS.items()))
    log = b"a line of an ordinary log\n" * 4000 + secret.encode() + b"\n" + b"more\n" * 3000
    found = redact_entry(KEYRING, base64.b64encode(gzip.compress(log)).decode(), ())
    assert found.content == f"[REDACTED:{secret_id}]"
