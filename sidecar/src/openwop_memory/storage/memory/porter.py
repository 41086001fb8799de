"""The Porter stemmer as SQLite's FTS5 ``porter`` tokenizer applies it, in Python.

Martin Porter's 1980 algorithm with the two changes of his own later reference version that
FTS5 also makes (step 2 maps ``logi`` to ``log`` and ``bli`` to ``ble``, not ``abli`` to
``able``), applied to the UTF-8 bytes of one token that is already case-folded: every byte
outside ``a``-``z`` counts as a consonant, and tokens shorter than 3 bytes or longer than 64
pass unchanged, as they do in FTS5.

Each step's rules are grouped by the suffix's next-to-last letter, and within a group the
first rule whose suffix matches (the word being strictly longer than it) is the only one
tried: when its condition fails, the word is left as it is, as FTS5 does.

Written here rather than taken from a library because no library stems as FTS5 does:
snowballstemmer's ``porter`` (the nearest) gives another stem for 5 of the 6,474 distinct
words of this repository, ``possibly`` among them (``possibli``, where FTS5 has
``possibl``), and a different stem would rank the in-memory backend's searches apart from
SQLite's. ``tests/unit/test_memory_keywords.py`` checks every such word against FTS5 itself.
"""

from __future__ import annotations

from collections.abc import Callable

_MAX_TOKEN = 64  # FTS5_PORTER_MAX_TOKEN
_VOWELS = frozenset(b"aeiou")

Condition = Callable[[bytes], bool]


def _is_vowel(byte: int, y_is_vowel: bool) -> bool:
    return byte in _VOWELS or (y_is_vowel and byte == ord("y"))


def _gobble_vc(stem: bytes, start: int, previous_consonant: bool) -> int:
    """The end of the first vowels-then-consonant run of ``stem`` from ``start`` (the index
    after its consonant), or 0 if there is none: one unit of the measure ``m``."""
    consonant = previous_consonant
    i = start
    while i < len(stem):
        consonant = not _is_vowel(stem[i], consonant)
        if not consonant:
            break
        i += 1
    i += 1
    while i < len(stem):
        consonant = not _is_vowel(stem[i], consonant)
        if consonant:
            return i + 1
        i += 1
    return 0


def _m_gt0(stem: bytes) -> bool:
    return _gobble_vc(stem, 0, False) != 0


def _m_gt1(stem: bytes) -> bool:
    n = _gobble_vc(stem, 0, False)
    return n != 0 and _gobble_vc(stem, n, True) != 0


def _m_eq1(stem: bytes) -> bool:
    n = _gobble_vc(stem, 0, False)
    return n != 0 and _gobble_vc(stem, n, True) == 0


def _o_star(stem: bytes) -> bool:
    """The stem ends consonant-vowel-consonant, the last not w, x or y."""
    if stem[-1:] in (b"w", b"x", b"y"):
        return False
    mask = 0
    consonant = False
    for byte in stem:
        consonant = not _is_vowel(byte, consonant)
        mask = (mask << 1) | consonant
    return mask & 0b111 == 0b101


def _has_vowel(stem: bytes) -> bool:
    return any(_is_vowel(byte, i > 0) for i, byte in enumerate(stem))


def _m_gt1_s_or_t(stem: bytes) -> bool:
    return stem[-1:] in (b"s", b"t") and _m_gt1(stem)


# A rule: the suffix, the condition on the stem before it (None: always), its
# replacement, and whether applying it tells the caller so (FTS5 runs step 1b's second part
# only after "ed" or "ing" was removed, not after "eed" became "ee").
Rule = tuple[bytes, Condition | None, bytes, bool]


def _grouped(rules: list[Rule]) -> dict[int, list[Rule]]:
    groups: dict[int, list[Rule]] = {}
    for rule in rules:
        groups.setdefault(rule[0][-2], []).append(rule)
    return groups


_STEP_1B = _grouped(
    [
        (b"eed", _m_gt0, b"ee", False),
        (b"ed", _has_vowel, b"", True),
        (b"ing", _has_vowel, b"", True),
    ]
)
_STEP_1B2 = _grouped(
    [(b"at", None, b"ate", True), (b"bl", None, b"ble", True), (b"iz", None, b"ize", True)]
)
_STEP_2 = _grouped(
    [
        (suffix, _m_gt0, replacement, False)
        for suffix, replacement in (
            (b"ational", b"ate"),
            (b"tional", b"tion"),
            (b"enci", b"ence"),
            (b"anci", b"ance"),
            (b"izer", b"ize"),
            (b"logi", b"log"),
            (b"bli", b"ble"),
            (b"alli", b"al"),
            (b"entli", b"ent"),
            (b"eli", b"e"),
            (b"ousli", b"ous"),
            (b"ization", b"ize"),
            (b"ation", b"ate"),
            (b"ator", b"ate"),
            (b"alism", b"al"),
            (b"iveness", b"ive"),
            (b"fulness", b"ful"),
            (b"ousness", b"ous"),
            (b"aliti", b"al"),
            (b"iviti", b"ive"),
            (b"biliti", b"ble"),
        )
    ]
)
_STEP_3 = _grouped(
    [
        (suffix, _m_gt0, replacement, False)
        for suffix, replacement in (
            (b"icate", b"ic"),
            (b"ative", b""),
            (b"alize", b"al"),
            (b"iciti", b"ic"),
            (b"ical", b"ic"),
            (b"ful", b""),
            (b"ness", b""),
        )
    ]
)
_STEP_4 = _grouped(
    [
        (suffix, _m_gt1_s_or_t if suffix == b"ion" else _m_gt1, b"", False)
        for suffix in (
            b"al",
            b"ance",
            b"ence",
            b"er",
            b"ic",
            b"able",
            b"ible",
            b"ant",
            b"ement",
            b"ment",
            b"ent",
            b"ion",
            b"ou",
            b"ism",
            b"ate",
            b"iti",
            b"ous",
            b"ive",
            b"ize",
        )
    ]
)


def _step(word: bytes, groups: dict[int, list[Rule]]) -> tuple[bytes, bool]:
    """``word`` after the first of its group's rules that matches (if its condition holds),
    and whether a rule that signals was applied."""
    if len(word) < 2:
        return word, False
    for suffix, condition, replacement, signals in groups.get(word[-2], ()):
        if len(word) > len(suffix) and word.endswith(suffix):
            stem = word[: -len(suffix)]
            if condition is None or condition(stem):
                return stem + replacement, signals
            return word, False
    return word, False


def _step_1a(word: bytes) -> bytes:
    if word.endswith(b"s"):
        if word[-2:-1] == b"e":
            if (len(word) > 4 and word[-4:-2] == b"ss") or (len(word) > 3 and word[-3] == ord("i")):
                return word[:-2]
            return word[:-1]
        if word[-2:-1] != b"s":
            return word[:-1]
    return word


def stem(token: str) -> str:
    """The stem of one case-folded token, as FTS5's ``porter`` tokenizer makes it."""
    word = token.encode()
    if not 3 <= len(word) <= _MAX_TOKEN:
        return token
    word = _step_1a(word)
    word, changed = _step(word, _STEP_1B)
    if changed:
        word, lengthened = _step(word, _STEP_1B2)
        if not lengthened:
            last = word[-1]
            if (
                not _is_vowel(last, False)
                and last not in b"lsz"
                and len(word) > 1
                and last == word[-2]
            ):
                word = word[:-1]
            elif _m_eq1(word) and _o_star(word):
                word += b"e"
    if word.endswith(b"y") and _has_vowel(word[:-1]):
        word = word[:-1] + b"i"
    word, _ = _step(word, _STEP_2)
    word, _ = _step(word, _STEP_3)
    word, _ = _step(word, _STEP_4)
    if word.endswith(b"e"):
        stem_ = word[:-1]
        if _m_gt1(stem_) or (_m_eq1(stem_) and not _o_star(stem_)):
            word = stem_
    if len(word) > 1 and word.endswith(b"ll") and _m_gt1(word[:-1]):
        word = word[:-1]
    return word.decode()
