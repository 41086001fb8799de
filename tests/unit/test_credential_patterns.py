"""Unit tests of the well-known credential formats (``redaction/credential_patterns.py``).

Every example credential is generated from random characters of the format's alphabet at
test time, so no key-shaped literal sits in the repository for secret scanners to flag.
"""

from __future__ import annotations

import base64
import json
import random
import string
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openwop_memory.redaction.credential_patterns import PATTERNS, find_credentials

pytestmark = pytest.mark.backend_independent

UPPER_DIGITS = string.ascii_uppercase + string.digits
ALNUM = string.ascii_letters + string.digits
B64URL = ALNUM + "-_"
B64 = ALNUM + "+/"
HEX = "0123456789abcdef"
NAMES = {p.name for p in PATTERNS}


def rand(rng: random.Random, alphabet: str, n: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


@dataclass(frozen=True)
class Example:
    """``text`` holds one credential; ``secret`` is the part that must be reported."""

    name: str
    label: str
    text: str
    secret: str


def _jwt(rng: random.Random) -> str:
    header = b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    payload = b64url(json.dumps({"sub": rand(rng, ALNUM, 12), "iat": 1700000000}).encode())
    return f"{header}.{payload}.{b64url(rng.randbytes(32))}"


def _pem(rng: random.Random, kind: str, headers: str = "", checksum: bool = False) -> str:
    body = base64.b64encode(rng.randbytes(600)).decode()
    lines = [body[i : i + 64] for i in range(0, len(body), 64)]
    if checksum:
        lines.append("=" + base64.b64encode(rng.randbytes(3)).decode())
    return "\n".join([f"-----BEGIN {kind}-----", *([headers] if headers else []), *lines]) + (
        f"\n-----END {kind}-----"
    )


def _examples() -> list[Example]:
    rng = random.Random(20240917)
    out: list[Example] = []

    def add(name: str, label: str, text: str, secret: str | None = None) -> None:
        out.append(Example(name, label, text, text if secret is None else secret))

    add("aws-access-key-id", "akia", "AKIA" + rand(rng, UPPER_DIGITS, 16))
    add("aws-access-key-id", "asia", "ASIA" + rand(rng, UPPER_DIGITS, 16))
    for label, template in (
        ("ini", "aws_secret_access_key = {}"),
        ("env", "AWS_SECRET_ACCESS_KEY={}"),
        ("json", '"SecretAccessKey": "{}"'),
        ("yaml", "secretAccessKey: {}"),
    ):
        secret = rand(rng, B64, 40)
        add("aws-secret-access-key", label, template.format(secret), secret)
    add("github-token", "ghp", "ghp_" + rand(rng, ALNUM, 36))
    add("github-token", "gho", "gho_" + rand(rng, ALNUM, 36))
    add("github-token", "ghs-stateless", f"ghs_{rng.randrange(10**5, 10**7)}_{_jwt(rng)}")
    add(
        "github-fine-grained-token",
        "pat",
        f"github_pat_{rand(rng, ALNUM, 22)}_{rand(rng, ALNUM, 59)}",
    )
    add("gitlab-token", "glpat", "glpat-" + rand(rng, ALNUM, 20))
    add(
        "gitlab-token",
        "routable",
        f"glpat-{rand(rng, B64URL, 27)}.01.{rand(rng, HEX, 9)}",
    )
    add("gitlab-token", "glrt", "glrt-" + rand(rng, B64URL, 24))
    add("openai-api-key", "proj", "sk-proj-" + rand(rng, B64URL, 156))
    add("openai-api-key", "svcacct", "sk-svcacct-" + rand(rng, B64URL, 120))
    add(
        "openai-api-key",
        "legacy",
        f"sk-{rand(rng, ALNUM, 20)}T3BlbkFJ{rand(rng, ALNUM, 20)}",
    )
    add("anthropic-api-key", "api03", f"sk-ant-api03-{rand(rng, B64URL, 93)}AA")
    add("anthropic-api-key", "admin01", f"sk-ant-admin01-{rand(rng, B64URL, 93)}AA")
    digits = string.digits
    add(
        "slack-token",
        "xoxb",
        f"xoxb-{rand(rng, digits, 12)}-{rand(rng, digits, 13)}-{rand(rng, ALNUM, 24)}",
    )
    add(
        "slack-token",
        "xoxp",
        f"xoxp-{rand(rng, digits, 12)}-{rand(rng, digits, 12)}-{rand(rng, digits, 13)}"
        f"-{rand(rng, HEX, 32)}",
    )
    add("slack-token", "xoxe.xoxp", "xoxe.xoxp-1-" + rand(rng, ALNUM, 140))
    add(
        "slack-token",
        "xapp",
        f"xapp-1-A{rand(rng, UPPER_DIGITS, 10)}-{rand(rng, digits, 13)}-{rand(rng, HEX, 64)}",
    )
    add(
        "slack-webhook-url",
        "services",
        f"https://hooks.slack.com/services/T{rand(rng, UPPER_DIGITS, 10)}"
        f"/B{rand(rng, UPPER_DIGITS, 10)}/{rand(rng, ALNUM, 24)}",
    )
    add("stripe-secret-key", "live", "sk_live_" + rand(rng, ALNUM, 99))
    add("stripe-secret-key", "restricted", "rk_test_" + rand(rng, ALNUM, 24))
    add("stripe-webhook-secret", "whsec", "whsec_" + rand(rng, ALNUM, 32))
    add("private-key", "rsa", _pem(rng, "RSA PRIVATE KEY"))
    add("private-key", "pkcs8", _pem(rng, "PRIVATE KEY"))
    add("private-key", "openssh", _pem(rng, "OPENSSH PRIVATE KEY"))
    add(
        "private-key",
        "encrypted-pkcs1",
        _pem(rng, "EC PRIVATE KEY", f"Proc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,{HEX * 2}\n"),
    )
    add(
        "private-key",
        "pgp",
        _pem(rng, "PGP PRIVATE KEY BLOCK", "Version: GnuPG v2\n", checksum=True),
    )
    # A service-account file holds the key with its newlines written as the two chars \n.
    escaped = _pem(rng, "PRIVATE KEY").replace("\n", "\\n")
    add("private-key", "escaped-newlines", '{"private_key": "' + escaped + '\\n"}', escaped)
    truncated = _pem(rng, "RSA PRIVATE KEY").rsplit("\n", 3)[0]
    add("private-key", "truncated", truncated + "\nand the rest was cut off", truncated)
    add("jwt", "hs256", _jwt(rng))
    add("google-api-key", "aiza", "AIza" + rand(rng, B64URL, 35))
    add("google-oauth-client-secret", "gocspx", "GOCSPX-" + rand(rng, B64URL, 28))
    account_key = base64.b64encode(rng.randbytes(64)).decode()
    add(
        "azure-storage-account-key",
        "connection-string",
        "DefaultEndpointsProtocol=https;AccountName=acct;"
        f"AccountKey={account_key};EndpointSuffix=core.windows.net",
        account_key,
    )
    add("twilio-api-key", "sk", "SK" + rand(rng, HEX, 32))
    add("sendgrid-api-key", "sg", f"SG.{rand(rng, B64URL, 22)}.{rand(rng, B64URL, 43)}")
    add("npm-token", "npm", "npm_" + rand(rng, ALNUM, 36))
    add("pypi-token", "pypi", "pypi-AgEIcHlwaS5vcmc" + rand(rng, B64URL, 160))
    add("pypi-token", "testpypi", "pypi-AgENdGVzdC5weXBpLm9yZw" + rand(rng, B64URL, 160))
    add("huggingface-token", "hf", "hf_" + rand(rng, ALNUM, 34))
    add("digitalocean-token", "dop", "dop_v1_" + rand(rng, HEX, 64))
    add("shopify-token", "shpat", "shpat_" + rand(rng, HEX, 32))
    add("databricks-token", "dapi", "dapi" + rand(rng, HEX, 32))
    add("databricks-token", "suffixed", "dapi" + rand(rng, HEX, 32) + "-2")
    add("docker-hub-token", "pat", "dckr_pat_" + rand(rng, B64URL, 27))
    add("linear-api-key", "lin", "lin_api_" + rand(rng, ALNUM, 40))
    add("hashicorp-vault-token", "hvs", "hvs." + rand(rng, B64URL, 91))
    add("hashicorp-vault-token", "hvb", "hvb." + rand(rng, B64URL, 138))
    token = f"{rand(rng, digits, 10)}:AA{rand(rng, B64URL, 33)}"
    add("telegram-bot-token", "bare", token)
    add("telegram-bot-token", "bot-url", f"https://api.telegram.org/bot{token}/getMe", token)
    password = rand(rng, ALNUM, 20)
    add(
        "url-credentials", "postgres", f"postgres://admin:{password}@db.internal:5432/app", password
    )
    password = rand(rng, ALNUM + "%!*", 24)
    add("url-credentials", "redis-no-user", f"redis://:{password}@cache:6379/0", password)
    password = f"{rand(rng, ALNUM, 6)}@{rand(rng, ALNUM, 6)}"
    add("url-credentials", "at-in-password", f"https://bob:{password}@git.example/x", password)
    password = rand(rng, ALNUM, 16)
    add(
        "url-credentials",
        "socket-host",
        f"postgresql://app:{password}@/appdb?host=/run/postgresql",
        password,
    )
    return out


EXAMPLES = _examples()


def _surroundings(example: Example) -> list[tuple[str, str, str]]:
    """(label, text, the secret as it appears in text) for each way of embedding it."""
    text, secret = example.text, example.secret
    json_text = json.dumps({"env": {"VALUE": text}, "note": "rotate me"})
    return [
        ("alone", text, secret),
        ("start", text + " is what the config held", secret),
        ("end", "the config held " + text, secret),
        ("prose", f"Use {text}, then rotate it.\nThanks!", secret),
        ("json", json_text, json.dumps(secret)[1:-1]),
    ]


CASES = [
    pytest.param(example, where, text, secret, id=f"{example.name}-{example.label}-{where}")
    for example in EXAMPLES
    for where, text, secret in _surroundings(example)
]


@pytest.mark.parametrize(("example", "where", "text", "secret"), CASES)
def test_finds_exact_span(example: Example, where: str, text: str, secret: str) -> None:
    start = text.index(secret)
    assert text.count(secret) == 1
    assert find_credentials(text) == [(start, start + len(secret), example.name)]


def test_every_format_has_an_example() -> None:
    assert {e.name for e in EXAMPLES} == NAMES


def test_patterns_are_well_formed() -> None:
    assert len(NAMES) == len(PATTERNS)
    for pattern in PATTERNS:
        assert pattern.name.replace("-", "").isalnum() and pattern.name.islower()
        assert pattern.anchors and all(pattern.anchors)
        assert pattern.lookback >= 0


def test_anchor_scan_keeps_its_prefilter() -> None:
    # The automaton's SIMD prefilter handles at most 64 anchors (see the module docstring).
    long_anchors = {a for p in PATTERNS for a in p.anchors if len(a) >= 4}
    assert len(long_anchors) <= 64


def test_examples_side_by_side() -> None:
    joined = ""
    expected: list[tuple[int, int, str]] = []
    for example in EXAMPLES:
        joined += "\n-- next: "
        start = len(joined) + example.text.index(example.secret)
        expected.append((start, start + len(example.secret), example.name))
        joined += example.text
    assert find_credentials(joined) == expected


def test_overlap_keeps_the_longer_or_the_specific() -> None:
    rng = random.Random(7)
    token = "ghp_" + rand(rng, ALNUM, 36)
    text = f"https://someone:{token}@github.com/org/repo.git"
    at = text.index(token)
    # Same span as url-credentials: the specific format names it.
    assert find_credentials(text) == [(at, at + len(token), "github-token")]
    stateless = f"ghs_12345_{_jwt(rng)}"
    assert find_credentials(stateless) == [(0, len(stateless), "github-token")]


def test_lone_surrogates_and_non_latin_text() -> None:
    rng = random.Random(8)
    token = "hf_" + rand(rng, ALNUM, 34)
    text = "\ud800 клю́ч 鍵 🔑 " + token + " \udfff"
    at = text.index(token)
    assert find_credentials(text) == [(at, at + len(token), "huggingface-token")]


# -- negatives ------------------------------------------------------------------------------


def _decoys() -> list[str]:
    rng = random.Random(99)
    upper16 = rand(rng, UPPER_DIGITS, 16)
    hex32 = rand(rng, HEX, 32)
    ellipsis_pem = "-----BEGIN RSA PRIVATE KEY-----\nMIIE...\n-----END RSA PRIVATE KEY-----"
    certificate = (
        "-----BEGIN CERTIFICATE-----\n"
        + base64.b64encode(rng.randbytes(300)).decode()
        + "\n-----END CERTIFICATE-----"
    )
    return [
        "ghp_short",
        "ghp_" + rand(rng, ALNUM, 35),
        "xghp_" + rand(rng, ALNUM, 36),
        "AKIA" + rand(rng, string.ascii_lowercase, 16),
        "AKIA" + upper16[:15],
        "AKIA" + upper16 + "X",
        "XAKIA" + upper16,
        "sk-proj-",
        "sk-proj-" + rand(rng, ALNUM, 20),
        "sk-ant-api03-short",
        "xoxb-",
        "xoxb-123456-",
        "eyJhbGciOi",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0",
        "sk-learn and scikit-learn",
        "task_id = skeleton.task_id  # TASK, DISK, MASK",
        "SK" + hex32[:31],
        "SK" + hex32 + "a",
        "TASK" + hex32,
        "hf_" + rand(rng, ALNUM, 33),
        "npm_install_dependencies_for_the_whole_workspace_now",
        "AIza" + rand(rng, B64URL, 34),
        "github_pat_" + rand(rng, ALNUM, 22),
        "glpat-short",
        "sk_live_" + rand(rng, ALNUM, 10),
        "whsec_" + rand(rng, ALNUM, 10),
        "dapi" + hex32[:31],
        "dapi_version = 3",
        "hvs.short",
        "self.hvs." + rand(rng, B64URL, 100),
        "12345:AA" + rand(rng, B64URL, 33),
        "12345678901:AA" + rand(rng, B64URL, 33),
        "AccountKey=" + rand(rng, B64, 20),
        "aws_secret_access_key = <your secret key>",
        "aws_secret_access_key = " + rand(rng, B64, 41),
        "SecretAccessKey" + rand(rng, B64, 40),
        ellipsis_pem,
        certificate,
        "-----BEGIN PUBLIC KEY-----\n" + base64.b64encode(rng.randbytes(270)).decode(),
        "https://example.com:8080/path?q=1",
        "mail user@example.com or see http://user@host/",
        "ftp://host/a:b@c",
        "SG.short.thing",
        "dop_v1_" + hex32,
        "shpat_" + hex32[:31],
        "lin_api_" + rand(rng, ALNUM, 39),
        "dckr_pat_short",
        "pypi-AgEIcHlwaS5vcmc",
        "T3BlbkFJ alone",
    ]


@pytest.mark.parametrize("text", _decoys())
def test_decoys_are_not_credentials(text: str) -> None:
    assert find_credentials(text) == []


def test_random_blobs_are_not_credentials() -> None:
    rng = random.Random(1234)
    data = rng.randbytes(300_000)
    blobs = [
        data.hex(),
        data.hex().upper(),
        base64.b64encode(data).decode(),
        base64.urlsafe_b64encode(data).decode(),
        base64.b32encode(data).decode(),
        "\n".join(base64.b64encode(data[i : i + 48]).decode() for i in range(0, len(data), 48)),
        " ".join(rand(rng, ALNUM, rng.randrange(1, 60)) for _ in range(20_000)),
    ]
    for blob in blobs:
        assert find_credentials(blob) == []


def _stdlib_sources() -> list[Path]:
    # /usr/lib/python3.11 has no test suite; an interpreter's own stdlib does, and its
    # urllib tests hold URLs with example passwords ("user:pass@"), which are reported.
    root = Path("/usr/lib/python3.11")
    if not root.is_dir():
        root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "site-packages", "dist-packages", "idlelib"}
    return [p for p in sorted(root.rglob("*.py")) if not skip & set(p.relative_to(root).parts)]


def test_stdlib_source_has_no_credentials() -> None:
    budget = 4_000_000
    offenders: dict[str, list[tuple[str, str]]] = {}
    read = 0
    for path in _stdlib_sources():
        if read >= budget:
            break
        text = path.read_text(encoding="utf-8", errors="surrogateescape")
        read += len(text)
        found = find_credentials(text)
        if found:
            offenders[str(path)] = [(text[s:e][:60], name) for s, e, name in found]
    assert read >= 1_000_000, "too little stdlib source to be a meaningful test"
    assert offenders == {}


def test_anchor_floods_stay_linear() -> None:
    # Regexes run only at anchors, but a text packed with anchors must not make each one
    # rescan the rest of the text: 32 KiB of one anchor takes ~0.1 s, a quadratic scan
    # several seconds.
    slowest = (0.0, "")
    for pattern in PATTERNS:
        for anchor in pattern.anchors:
            for glue in ("", "-"):
                text = (anchor + glue) * (32_768 // (len(anchor) + len(glue)))
                start = time.perf_counter()
                find_credentials(text)
                slowest = max(slowest, (time.perf_counter() - start, f"{anchor!r}+{glue!r}"))
    assert slowest[0] < 1.0, slowest


# -- properties -----------------------------------------------------------------------------

_PIECES = sorted({a for p in PATTERNS for a in p.anchors} | {e.text for e in EXAMPLES[::5]})
_ANY_CHAR = st.characters(exclude_categories=())  # includes lone surrogates
_FRAGMENT: st.SearchStrategy[str] = st.one_of(
    st.text(_ANY_CHAR, max_size=20),
    st.text(B64URL + ".:/@=+ \n\\", max_size=40),
    st.sampled_from(_PIECES),
    st.sampled_from(_PIECES).map(lambda s: s[: len(s) // 2]),
)


def _check_result(text: str, found: list[tuple[int, int, str]]) -> None:
    previous_end = 0
    for start, end, name in found:
        assert previous_end <= start < end <= len(text)
        assert name in NAMES
        previous_end = end


@settings(max_examples=300, deadline=None)
@given(st.lists(_FRAGMENT, max_size=12).map("".join))
def test_never_raises_and_spans_are_sane(text: str) -> None:
    _check_result(text, find_credentials(text))


@settings(max_examples=100, deadline=None)
@given(st.text(_ANY_CHAR, max_size=300))
def test_arbitrary_text(text: str) -> None:
    _check_result(text, find_credentials(text))


def test_result_is_pure() -> None:
    text = "\n".join(e.text for e in EXAMPLES)
    assert find_credentials(text) == find_credentials(text)
