"""SR-1 write-time redaction: compile a keyring, redact an entry, read the findings.

What the package promises: :func:`redact_entry` replaces every registered secret in an
entry's content and tags with ``[REDACTED:<secretId>]``, found verbatim, disguised, encoded,
decoded or split across fields, and every well-known credential format with
``[REDACTED:pattern:<format>]`` unless the pattern policy is ``off``. It is pure and never
raises; an entry in which a secret survived rewriting comes back with ``leaked`` set, and
the caller must not store it. What counts as a secret, what is replaced and what it costs is
said in the modules:

- ``redact.py``: :func:`redact_entry`, the full search, :class:`Finding`, :class:`Redacted`
  and :func:`marker` (what counts as a secret, and what is replaced);
- ``keyring.py``: :class:`Keyring`, the compiled automata searching one text for every
  secret, and :func:`estimate_bytes`, its memory before it is compiled;
- ``fold.py``: the fold removing disguises (case, look-alikes, invisible characters...);
- ``needles.py``: the forms of one secret searched for (encodings, digest, reversal);
- ``decode.py``: escapes and encoded blobs decoded before searching again;
- ``credential_patterns.py``: the well-known credential formats.

The package imports nothing of the service that uses it.
"""

from __future__ import annotations

from .keyring import Keyring, estimate_bytes
from .redact import EMPTY_KEYRING, Finding, PatternPolicy, Redacted, marker, redact_entry

__all__ = [
    "EMPTY_KEYRING",
    "Finding",
    "Keyring",
    "PatternPolicy",
    "Redacted",
    "estimate_bytes",
    "marker",
    "redact_entry",
]
