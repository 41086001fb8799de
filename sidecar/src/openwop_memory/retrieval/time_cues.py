"""Time in relevance: whether a query asks when something happened (:func:`asks_when`) and
whether an entry's text says when (:func:`says_when`).

A "when" question is answered by a turn that dates its event: "I went to the support group
yesterday", "we exchanged on Friday", "back on the 3rd". On long labelled conversations
three quarters of the evidence of "when" questions held such a phrase against one turn in
six overall, so a hybrid search ranks the entries that say when a little higher for a
query that asks when (:data:`SAYS_WHEN`). The entry's time of writing is not a cue: every
entry has one (its ``createdAt``, returned with it), and a date stamp that opens the text
(``"8 May 2023 Ana: ..."``, ``"[2023-05-08 14:02] ..."``) is the same label written into
the content, so it is passed over.

English only, as the stop words are; a query in another language asks nothing here and is
ranked as before.
"""

from __future__ import annotations

import re

SAYS_WHEN = 0.25
"""How much more an entry that says when weighs for a query that asks when: its fused
score times ``1 + SAYS_WHEN``, every score then divided by the same, so scores stay in
[0, 1]. Measured on the conversations benchmark (``bench/conversations.py``): 0.2 to 0.35
lift the natural chats' "when" questions without moving the made-up ones'; 0.5 costs the
made-up ones, whose dated turns rarely say when in words."""

_MONTH = (
    r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?"
    r"|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"
)
_DAY = r"(?:mon|tues|wednes|thurs|fri|satur|sun)days?"
_SPAN = (
    r"(?:days?|weeks?|weekends?|months?|years?|nights?|mornings?|evenings?"
    r"|summer|winter|spring|autumn|fall)"
)
_DATE = (
    rf"(?:\d{{1,2}}(?:st|nd|rd|th)?\s+{_MONTH}\.?(?:,?\s+\d{{4}})?"
    rf"|{_MONTH}\.?\s+\d{{1,2}}(?:st|nd|rd|th)?(?:,?\s+\d{{4}})?"
    r"|\d{4}-\d{2}-\d{2}(?:[t ]\d{2}:\d{2}(?::\d{2})?)?"
    r"|\d{1,2}/\d{1,2}(?:/\d{2,4})?)"
)
# A date (and time) stamp at the very start of a text: the entry's label, not a cue.
_STAMP = re.compile(
    rf"^\W{{0,3}}(?:{_DAY},?\s+)?{_DATE}(?:,?\s+(?:at\s+)?\d{{1,2}}[:.]\d{{2}}(?:\s*[ap]\.?m\.?)?)?",
    re.IGNORECASE,
)
_SAYS = re.compile(
    r"\b(?:yesterday|today|tonight|tomorrow|ago"
    rf"|(?:last|next|this|coming|past|previous)\s+(?:{_SPAN}|{_DAY}|time|{_MONTH})"
    rf"|{_DAY}|{_DATE}"
    r"|the\s+\d{1,2}(?:st|nd|rd|th)"
    rf"|\d+\s+{_SPAN}"
    rf"|(?:in|since|until|till|before|after|by)\s+(?:{_MONTH}|\d{{4}})"
    r")\b",
    re.IGNORECASE,
)
# A comparison ("which came first", "before or after") is not asking when: its evidence is
# the two events' turns, which need not date them (weighing dated turns there cost the
# made-up chats' multi-hop questions 0.01 of recall).
_ASKS = re.compile(
    r"^\W*(?:when|since when|until when)\b"
    r"|\b(?:what|which)\s+(?:date|day|days|year|month|week|weekend|time|season)\b"
    r"|\bhow\s+long\b|\bhow\s+many\s+(?:days|weeks|months|years)\b",
    re.IGNORECASE,
)


def asks_when(query: str) -> bool:
    """Whether ``query`` asks when something happened, on what date, or how long ago or
    for how long (not which of two things came first: see ``_ASKS``)."""
    return _ASKS.search(query) is not None


def says_when(content: str) -> bool:
    """Whether ``content`` dates something in words or figures (``"yesterday"``, ``"last
    week"``, ``"on Friday"``, ``"the 24th"``, ``"3 days"``, ``"12 March"``, ``"in 2019"``),
    a date stamp opening it aside."""
    stamp = _STAMP.match(content)
    return _SAYS.search(content, stamp.end() if stamp else 0) is not None
