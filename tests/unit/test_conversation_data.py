"""The conversations benchmark's data (bench/conversation_data.py) holds what its questions
promise: the same for the same seed, sizes in range, every evidence id a turn, a multi-hop
question's evidence in different sessions, a temporal answer its evidence's date."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.backend_independent

ROOT = Path(__file__).resolve().parents[2]


def test_the_generated_conversations_keep_their_labels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    from bench.conversation_data import KINDS, generate

    data = generate()
    assert data == generate(), "not deterministic"
    assert data != generate(seed=1)
    assert len(data) >= 10
    assert 4500 <= sum(len(c.turns) for c in data) <= 6000
    questions = [q for c in data for q in c.questions]
    assert len(questions) >= 600
    assert {q.kind for q in questions} == set(KINDS)
    for conv in data:
        assert 15 <= len(conv.sessions) <= 30
        session_of = {t.id: n for n, s in enumerate(conv.sessions) for t in s}
        turns = {t.id: t for t in conv.turns}
        assert len(turns) == len(conv.turns), "turn ids repeat"
        for session in conv.sessions:
            assert 15 <= len(session) <= 40
            assert len({t.date for t in session}) == 1
        for q in conv.questions:
            assert q.evidence and all(e in turns for e in q.evidence), q
            if q.kind == "multi-hop":
                assert len({session_of[e] for e in q.evidence}) == len(q.evidence), q
            if q.kind == "temporal":
                assert q.answer == turns[q.evidence[0]].date, q
            # Each evidence turn is said by the person the question is about.
            assert all(turns[e].speaker in q.text for e in q.evidence), q


def test_the_written_chats_keep_their_labels(monkeypatch: pytest.MonkeyPatch) -> None:
    """bench/data/chats/: every evidence id a turn, multi-hop evidence in two sessions or
    more, every speaker one of the chat's two, every kind asked, dates in order."""
    import datetime as dt

    monkeypatch.syspath_prepend(str(ROOT))
    from bench.conversation_data import KINDS, MONTHS, written

    data = written()
    assert len(data) == 10
    assert sum(len(c.turns) for c in data) >= 4000
    assert sum(len(c.questions) for c in data) >= 600
    for conv in data:
        assert {q.kind for q in conv.questions} == set(KINDS)
        session_of = {t.id: n for n, s in enumerate(conv.sessions) for t in s}
        assert len(session_of) == len(conv.turns), "turn ids repeat"
        assert {t.speaker for t in conv.turns} == set(conv.speakers)
        days = []
        for session in conv.sessions:
            day, month, year = session[0].date.split()
            days.append(dt.date(int(year), MONTHS.index(month) + 1, int(day)))
        assert days == sorted(days), conv.id
        for q in conv.questions:
            assert q.evidence and all(e in session_of for e in q.evidence), q
            if q.kind == "multi-hop":
                assert len({session_of[e] for e in q.evidence}) >= 2, q
