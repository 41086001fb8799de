"""The embedding model as the service uses it: present or not, loaded once on first need,
and a text's vector computed on the event loop or, for text longer than the encoder's
``inline_chars`` (every text, for a transformer), on a worker thread.

The model is the one ``embedding_model`` names (:func:`~retrieval.encoders.load_encoder`).
Loading reads its files and takes a fraction of a second of CPU (the light model; about
0.6 s for all-MiniLM-L6-v2), so it waits for the first put or relevance search rather than
delaying every start (most starts in the tests never need it); that first request waits
for it, on a worker thread.
"""

from __future__ import annotations

from collections import OrderedDict

import anyio
import anyio.to_thread
import structlog

from ..retrieval.encoders import (
    DEFAULT_MODEL,
    Encoder,
    EncoderUnavailableError,
    load_encoder,
    model_installed,
)

log = structlog.get_logger("openwop_memory.service")

# Queries whose vectors are kept (least recently asked dropped first), and the longest
# query kept: agents ask the same few queries run after run, and a sentence encoder's
# query costs ~10 ms of CPU, the most of a relevance list. At most ~1.5 MiB.
_QUERIES_KEPT = 512
_QUERY_CHARS_KEPT = 2048


class EmbeddingModel:
    """The model called ``model``, if its package is installed: ``installed`` says so (and
    turns false if it then fails to load, which is logged once)."""

    def __init__(self, *, enabled: bool = True, model: str = DEFAULT_MODEL) -> None:
        self.name = model
        self.installed = enabled and model_installed(model)
        self._encoder: Encoder | None = None
        self._lock = anyio.Lock()
        self._queries: OrderedDict[str, bytes | None] = OrderedDict()

    async def _loaded(self) -> Encoder | None:
        if self._encoder is not None or not self.installed:
            return self._encoder
        async with self._lock:
            if self._encoder is None and self.installed:
                try:
                    self._encoder = await anyio.to_thread.run_sync(load_encoder, self.name)
                except EncoderUnavailableError as exc:
                    self.installed = False
                    log.warning(
                        "embedding_model_unavailable",
                        reason=str(exc),
                        hint="relevance ranks by keywords only; reinstall the search extra",
                    )
                else:
                    log.info("embedding_model_loaded", model=self.name)
        return self._encoder

    async def vector(self, text: str) -> bytes | None:
        """The stored vector of ``text`` (its row of :meth:`~retrieval.encoders.Encoder.embed`
        as bytes); ``None`` without the model or for text without a word."""
        encoder = await self._loaded()
        if encoder is None:
            return None
        # The encoder says how long a text it computes faster than a thread hand-off
        # (Encoder.inline_chars): the light model's short texts stay on the loop, a
        # transformer's every text goes to a thread so no request waits behind it.
        if len(text) <= encoder.inline_chars:
            row = encoder.embed([text])[0]
        else:
            row = (await anyio.to_thread.run_sync(encoder.embed, [text]))[0]
        return row.tobytes() if row.any() else None

    @property
    def loaded(self) -> bool:
        """Whether the model is loaded (a first query waits for its load)."""
        return self._encoder is not None

    async def query_vector(self, query: str) -> bytes | None:
        """:meth:`vector` of a search's ``query``, the same bytes, from memory when it was
        asked lately (the model is deterministic, so a kept vector is the one it would
        compute again)."""
        kept = self._queries.get(query, b"")
        if kept != b"":
            self._queries.move_to_end(query)
            return kept
        vector = await self.vector(query)
        if len(query) <= _QUERY_CHARS_KEPT and self._encoder is not None:
            self._queries[query] = vector
            if len(self._queries) > _QUERIES_KEPT:
                self._queries.popitem(last=False)
        return vector

    async def vectors(self, texts: list[str]) -> list[bytes | None]:
        """The vector of each of ``texts``, as :meth:`vector` gives it, computed on a
        worker thread (a batch is milliseconds, or far more with a sentence encoder);
        ``None`` each without the model."""
        encoder = await self._loaded()
        if encoder is None:
            return [None] * len(texts)
        rows = await anyio.to_thread.run_sync(encoder.embed, texts)
        return [row.tobytes() if row.any() else None for row in rows]
