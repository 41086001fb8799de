"""A compiled keyring, and the search of one text for its secrets (no decoding here).

Two automata over the text's skeleton (``fold.py``):

- the *forms* (``needles.py``: the folded value, reversed, rot13, encoded), with
  every overlapping match reported, since each occurrence yields only a few;
- the *fragments*: 8-character keys of each value beyond its public prefix (and of its
  reversal and rot13), one every 5 characters so that any 12 characters of it hold one
  (``needles.key_starts``), every overlapping match reported, and each match grown in
  both directions for as long as the text goes on agreeing with the value; it counts once
  it spans 12 characters of the private part. An occurrence thus costs a few matches and
  a few slice comparisons however long it is, which keeps a text dense with secrets
  linear; and the keys are a seventh of the windows of 12 at every offset they replace
  (256 values of 64 characters: 6.7 MiB estimated instead of 15.7).

:meth:`Keyring.scan` promises hits as original-text spans: a verbatim value is replaced
exactly; a folded match also takes the punctuation the value has at that end; an encoded
match takes its whole encoded run, across line wraps.
"""

from __future__ import annotations

import codecs
import re
import unicodedata
from array import array
from collections.abc import Iterator, Mapping
from operator import itemgetter
from typing import NamedTuple

import ahocorasick_rs
from openwop_memory_client.wire import MIN_SECRET_CHARS

from .fold import Folded, Skeleton, fold, folded, skeleton, skeleton_bytes
from .needles import (
    FRAGMENT_CHARS,
    KEY_CHARS,
    Kind,
    Needle,
    form_needles,
    key_starts,
    public_prefix,
)

# What joins content and tags (and decodings) into one text: folds to nothing, so a secret
# split across them is found, and a folded hit's punctuation never reaches across it.
FIELD_SEPARATOR = "\0"
# A last line of a wrapped encoding this long is taken even when prose follows on its line.
_MIN_WRAPPED_LINE = 16
_LINE_BREAK = re.compile(r"\r?\n|\\r\\n|\\n")
# Pattern bytes per automaton: small enough that one builds in a few milliseconds, holding
# the GIL (see _automata).
_CHUNK_BYTES = 64 << 10


class Secret(NamedTuple):
    value: str
    id: str


class Hit(NamedTuple):
    start: int
    end: int
    secret: int  # index into the keyring's secrets, or -1 for a credential pattern
    pattern: str
    disguised: bool
    # False for an encoded run too short to hold the whole value: the rest of the value
    # may stand beside it (a percent-encoded head, a plain tail), so it is read on.
    complete: bool = True


def _automata(
    keys: list[str], kind: ahocorasick_rs.MatchKind
) -> list[tuple[int, ahocorasick_rs.BytesAhoCorasick]]:
    """Automata over ``keys``, each with the index of its first key, built in chunks of at
    most :data:`_CHUNK_BYTES`.

    Building an automaton holds the GIL throughout, for a big keyring's windows long enough
    to stall every other client of the sidecar; a chunk is quick, and the GIL can change
    hands between chunks. A keyring of a few keys still gets one automaton of each.
    """
    # ContiguousNFA builds several times faster than the DFA and still scans fast enough
    # (docs/benchmarks.md gives compile times and throughput).
    nfa = ahocorasick_rs.Implementation.ContiguousNFA
    out: list[tuple[int, ahocorasick_rs.BytesAhoCorasick]] = []
    start = size = 0
    encoded = [k.encode() for k in keys]
    for i, key in enumerate(encoded):
        size += len(key)
        if size >= _CHUNK_BYTES or i == len(encoded) - 1:
            chunk = encoded[start : i + 1]
            out.append(
                (start, ahocorasick_rs.BytesAhoCorasick(chunk, matchkind=kind, implementation=nfa))
            )
            start, size = i + 1, 0
    return out


def _common_forward(a: str, i: int, b: str, j: int) -> int:
    """Length of the longest common prefix of ``a[i:]`` and ``b[j:]`` (binary search)."""
    lo, hi = 0, min(len(a) - i, len(b) - j)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[i : i + mid] == b[j : j + mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _common_backward(a: str, i: int, b: str, j: int) -> int:
    """Length of the longest common suffix of ``a[:i]`` and ``b[:j]``."""
    lo, hi = 0, min(i, j)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[i - mid : i] == b[j - mid : j]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _char_offsets(data: bytes, positions: set[int]) -> dict[int, int]:
    """UTF-8 byte offsets (all at character boundaries) to character offsets, in one pass."""
    out: dict[int, int] = {}
    chars = last = 0
    for pos in sorted(positions):
        chars += len(data[last:pos].decode())
        last = pos
        out[pos] = chars
    return out


# What a compiled keyring holds, by measurement (tests/e2e/test_keyring_memory.py): a fixed
# part, then per secret its form needles' automaton states and objects, its strings (the
# value, reversed and rot13 copies, their skeletons), and per fragment key ~8 automaton
# states (~18 bytes each in a ContiguousNFA) plus its array slots and the growing of its
# matches. The fixed part was 8 KiB until a keyring of 2 short secrets measured 90 KiB
# resident on the CI machine and this tree's: the allocator's pages for a few small
# automata dominate there. The window figure was 300 bytes until 256 secrets of 256
# characters measured 1.34 to 1.50 times their resident memory, the ratio moving with the
# process's memory layout (the environment's size alone moved it): at 240 every measured
# shape sits between 0.77 and 1.21 times it.
_FIXED_BYTES = 40 << 10
_SECRET_BYTES = 16 << 10
_CHAR_BYTES = 6
_WINDOW_BYTES = 240


def estimate_bytes(ids_by_value: Mapping[str, str]) -> int:
    """The memory a :class:`Keyring` compiled from ``ids_by_value`` will hold, estimated
    without compiling it (one fold of each value), so that a keyring too large to hold can
    be refused before any work is done.

    Calibrated against the resident memory that compiled keyrings add to a process (the
    automata live outside the Python heap, where ``tracemalloc`` sees a fifth to a third of
    it): 0.77 to 1.21 times it from 2 secrets of 40 characters to 256 of 256 and 16 of
    4,096. ``tests/e2e/test_keyring_memory.py`` holds it to 0.6 to 1.5 times.
    """
    total = _FIXED_BYTES
    for value in ids_by_value:
        if len(value) < MIN_SECRET_CHARS:
            continue
        size = len(value.encode())
        windows = 3 * len(key_starts(len(fold(value[len(public_prefix(value)) :]))))
        # A non-ASCII value's windows are longer in UTF-8, and so are their automata.
        total += _SECRET_BYTES + _CHAR_BYTES * size + _WINDOW_BYTES * windows * size // len(value)
    return total


class _Windows:
    """Fragment windows, each key with the (source, offset) pairs it stands for.

    Held in flat arrays rather than a list of tuples per key: a keyring of 256 long values
    has tens of thousands of windows, and that many small objects would lengthen every
    full pass of the garbage collector (which holds the GIL), besides their own memory.
    """

    def __init__(self) -> None:
        self._keys: dict[str, int] = {}
        self._number = array("I")
        self._at = array("I")
        self._more: dict[int, list[tuple[int, int]]] = {}  # keys shared by several sources

    def add(self, key: str, number: int, at: int) -> None:
        slot = self._keys.setdefault(key, len(self._keys))
        if slot == len(self._number):
            self._number.append(number)
            self._at.append(at)
        else:
            self._more.setdefault(slot, []).append((number, at))

    def take_keys(self) -> list[str]:
        """The keys in slot order; the key strings are not kept (the automata hold them)."""
        keys = list(self._keys)
        self._keys = {}
        return keys

    def entries(self, slot: int) -> list[tuple[int, int]]:
        first = (self._number[slot], self._at[slot])
        more = self._more.get(slot)
        return [first] if more is None else [first, *more]

    def __len__(self) -> int:
        return len(self._number)


class Keyring:
    """A compiled keyring (value → secret id). Compile once per keyring change; immutable.

    Values shorter than :data:`MIN_SECRET_CHARS` are left out.
    """

    def __init__(self, ids_by_value: Mapping[str, str]) -> None:
        self.ids_by_value: Mapping[str, str] = {
            v: i for v, i in ids_by_value.items() if len(v) >= MIN_SECRET_CHARS
        }
        self._secrets = tuple(Secret(v, i) for v, i in sorted(self.ids_by_value.items()))
        forms: dict[str, list[tuple[int, Needle]]] = {}
        windows = _Windows()
        self._literal: list[int] = []  # values too short once folded: matched verbatim
        self._sources: list[tuple[int, Folded]] = []  # (secret, the value, reversed or rot13)
        self._private: list[tuple[int, int]] = []  # per source: where its private part is
        for index, secret in enumerate(self._secrets):
            value = secret.value
            needles = form_needles(value)
            if not needles or needles[0].kind is not Kind.RAW:
                self._literal.append(index)
            for needle in needles:
                forms.setdefault(needle.folded, []).append((index, needle))
            prefix = public_prefix(value)
            private = value[len(prefix) :]
            for source, window_text in (
                (value, private),
                (value[::-1], private[::-1]),
                (codecs.encode(value, "rot13"), codecs.encode(private, "rot13")),
            ):
                self._add_windows(windows, index, folded(source), fold(window_text))
        self._literal_values = tuple(self._secrets[i].value for i in self._literal)
        # Tuples of atoms, which the garbage collector stops tracking (see _Windows).
        self._forms = [tuple(entries) for entries in forms.values()]
        self._windows = windows
        self._forms_acs = _automata(list(forms), ahocorasick_rs.MatchKind.Standard)
        # Overlapping: a key short enough to match by chance must not hide, by its match,
        # a key of a real fragment beside it.
        self._windows_acs = _automata(windows.take_keys(), ahocorasick_rs.MatchKind.Standard)
        # A secret may be spread with separators; look this far around an escape for it.
        self.margin = 2 * max((len(s.value) for s in self._secrets), default=0)

    def _add_windows(
        self,
        windows: _Windows,
        index: int,
        source: Folded,
        private: str,
    ) -> None:
        """Register the fragment windows of ``private``, which ``source`` ends with (the value,
        rot13) or starts with (reversed)."""
        starts = key_starts(len(private))
        if not starts:
            return
        at = len(source.text) - len(private) if source.text.endswith(private) else 0
        self._sources.append((index, source))
        self._private.append((at, at + len(private)))
        number = len(self._sources) - 1
        # Every fragment holds a whole key (see key_starts); growing the key's match
        # recovers the rest of it.
        for i in starts:
            windows.add(private[i : i + KEY_CHARS], number, at + i)

    @classmethod
    def compile(cls, ids_by_value: Mapping[str, str]) -> Keyring:
        return cls(ids_by_value)

    def __len__(self) -> int:
        return len(self.ids_by_value)

    def secret(self, index: int) -> Secret:
        return self._secrets[index]

    def may_match(self, text: str) -> bool:
        """False only when :meth:`scan` finds nothing in ``text``; never raises.

        :meth:`scan` makes hits from three sources alone, and this asks each the same
        question: whether its automata match anything in the same skeleton
        (:func:`skeleton_bytes` is ``skeleton(text).data``, encoded), and whether a value
        matched verbatim occurs. It costs the automaton passes, without a :class:`Skeleton`.
        """
        if not self._secrets:
            return False
        data = skeleton_bytes(text)
        for _, ac in self._forms_acs:
            if ac.find_matches_as_indexes(data, overlapping=True):
                return True
        for _, ac in self._windows_acs:
            if ac.find_matches_as_indexes(data):
                return True
        # Most keyrings have no verbatim value: spare them the generator.
        return bool(self._literal_values) and any(v in text for v in self._literal_values)

    def scan(self, text: str) -> list[Hit]:
        """Hits of registered secrets in ``text`` itself (no decoding). Never raises."""
        if not self._secrets:
            return []
        data = skeleton_bytes(text)
        forms = [
            (offset + k, s, e)
            for offset, ac in self._forms_acs
            for k, s, e in ac.find_matches_as_indexes(data, overlapping=True)
        ]
        windows = [
            (offset + k, s, e)
            for offset, ac in self._windows_acs
            for k, s, e in ac.find_matches_as_indexes(data, overlapping=True)
        ]
        hits: list[Hit] = []
        if forms or windows:
            # The way back to the text is only needed for a match (most texts have none).
            skel = skeleton(text)
            windows.sort(key=itemgetter(1))  # _fragments reads them in text order
            if isinstance(skel.data, str):  # byte offsets to characters
                at = _char_offsets(data, {p for _, s, e in forms + windows for p in (s, e)})
                forms = [(k, at[s], at[e]) for k, s, e in forms]
                windows = [(k, at[s], at[e]) for k, s, e in windows]
            runs = _Runs(text)
            for key, s_start, s_end in forms:
                start, end = self._span(skel, s_start, s_end)
                for index, needle in self._forms[key]:
                    hits.append(self._widen(text, runs, start, end, index, needle))
            hits.extend(self._fragments(skel, windows))
        for index, value in zip(self._literal, self._literal_values, strict=True):
            at_ = text.find(value)
            while at_ >= 0:
                hits.append(Hit(at_, at_ + len(value), index, "", False))
                at_ = text.find(value, at_ + 1)
        return hits

    @staticmethod
    def _span(skel: Skeleton, s_start: int, s_end: int) -> tuple[int, int]:
        """The original span of skeleton ``[s_start, s_end)``, with trailing marks."""
        start, end = skel.origin(s_start), skel.origin(s_end - 1) + 1
        text = skel.text
        while end < len(text) and unicodedata.category(text[end]) in ("Mn", "Me", "Cf"):
            end += 1
        return start, end

    def _fragments(self, skel: Skeleton, windows: list[tuple[int, int, int]]) -> Iterator[Hit]:
        """Each window match grown to the whole stretch the text shares with its source."""
        if not windows:
            return
        data = skel.data.decode() if isinstance(skel.data, bytes) else skel.data
        reached: dict[int, int] = {}  # source → skeleton end of its last grown stretch
        for key, s_start, s_end in windows:
            for number, at in self._windows.entries(key):
                if reached.get(number, -1) >= s_end:
                    continue  # inside a stretch already found
                index, source = self._sources[number]
                right = _common_forward(data, s_end, source.text, at + KEY_CHARS)
                left = _common_backward(data, s_start, source.text, at)
                lo, hi = self._private[number]
                if min(hi, at + KEY_CHARS + right) - max(lo, at - left) < FRAGMENT_CHARS:
                    continue  # less than a fragment of the private part
                reached[number] = s_end + right
                start, end = self._span(skel, s_start - left, s_end + right)
                first, last = at - left, at + KEY_CHARS + right - 1
                yield self._padded(
                    skel.text, start, end, index, source.before(first), source.after(last)
                )

    def _padded(
        self, text: str, start: int, end: int, index: int, pad_left: str, pad_right: str
    ) -> Hit:
        """A folded hit, with as much of the value's own punctuation at either end as the
        text has there."""
        start -= _pad_reach(text, start, pad_left, -1)
        end += _pad_reach(text, end, pad_right, 1)
        return Hit(start, end, index, "", text[start:end] not in self._secrets[index].value)

    def _widen(
        self, text: str, runs: _Runs, start: int, end: int, index: int, needle: Needle
    ) -> Hit:
        if needle.kind is Kind.ENCODED:
            start, end = _encoded_run(text, runs, start, end, needle.alphabet)
            return Hit(start, end, index, "", True, end - start >= needle.whole)
        if needle.kind is Kind.RAW:
            value = self._secrets[index].value
            at = text.find(value, max(0, start - len(value)))
            while 0 <= at <= start:  # the verbatim occurrence holding the match, if any
                if at + len(value) >= end:
                    return Hit(at, at + len(value), index, "", False)
                at = text.find(value, at + 1)
        hit = self._padded(text, start, end, index, needle.pad_left, needle.pad_right)
        return hit._replace(disguised=True)


def _pad_reach(text: str, at: int, pad: str, step: int) -> int:
    """How far from ``at`` (leftwards for ``step`` -1, rightwards for 1) the value's own
    punctuation ``pad`` goes on in ``text``, separators between its characters allowed.

    Whitespace never counts: a space at a hit's edge separates as often as it belongs to the
    secret, and prose must come back as it was.
    """
    wanted = {unicodedata.normalize("NFKC", c) for c in pad} - set(" \t\r\n")
    if not wanted:
        return 0
    reach = 0
    i = at if step > 0 else at - 1
    for distance in range(1, 3 * len(pad) + 1):
        if not 0 <= i < len(text) or text[i] == FIELD_SEPARATOR or fold(text[i]):
            break
        if unicodedata.normalize("NFKC", text[i]) in wanted:
            reach = distance
        i += step
    return reach


class _Runs:
    """Where runs of an alphabet's characters begin and end in one text, answered at C
    speed from a same-length byte map of the text (built once per alphabet)."""

    def __init__(self, text: str) -> None:
        self._latin = text.encode("latin-1", "replace")
        self._maps: dict[str, bytes] = {}

    def _map(self, alphabet: str) -> bytes:
        mapped = self._maps.get(alphabet)
        if mapped is None:
            table = bytes(0x61 if chr(c) in alphabet else 0x20 for c in range(256))
            mapped = self._maps[alphabet] = self._latin.translate(table)
        return mapped

    def start(self, alphabet: str, at: int) -> int:
        """Where the run of ``alphabet`` ending at ``at`` begins."""
        return self._map(alphabet).rfind(b" ", 0, at) + 1

    def end(self, alphabet: str, at: int) -> int:
        """Where the run of ``alphabet`` beginning at ``at`` ends."""
        found = self._map(alphabet).find(b" ", at)
        return len(self._latin) if found < 0 else found


def _encoded_run(text: str, runs: _Runs, start: int, end: int, alphabet: str) -> tuple[int, int]:
    """The whole encoded run around ``[start, end)``, taking in whole lines of the alphabet
    on either side (a line-wrapped encoding)."""
    while True:
        start = runs.start(alphabet, start)
        line_end = start
        for brk in ("\r\n", "\n", "\\r\\n", "\\n"):
            if text.endswith(brk, 0, start):
                line_end = start - len(brk)
                break
        line_start = runs.start(alphabet, line_end)
        if line_end == start or line_start == line_end or _breaks_before(text, line_start):
            break
        start = line_start
    while True:
        end = runs.end(alphabet, end)
        wrap = _LINE_BREAK.match(text, end)
        if wrap is None:
            break
        line_end = runs.end(alphabet, wrap.end())
        whole_line = _ends_line(text, line_end) or line_end - wrap.end() >= _MIN_WRAPPED_LINE
        if line_end == wrap.end() or not whole_line:
            break
        end = line_end
    return start, end


def _breaks_before(text: str, at: int) -> bool:
    """True when the line ending at ``at``'s left is not a whole line of the run (the run's
    previous line must start at a line break or the start of the text)."""
    return not (at == 0 or text[at - 1] in "\n\"'" or text.endswith("\\n", 0, at))


def _ends_line(text: str, at: int) -> bool:
    return at == len(text) or _LINE_BREAK.match(text, at) is not None or text[at] in "\"'"
