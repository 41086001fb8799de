"""The embedding model as the service uses it: present or not, loaded once on first need,
and a text's vector computed on the event loop or, for long text, on a worker thread.

The model is the one ``embedding_model`` names (:func:`~retrieval.encoders.load_encoder`).
Loading reads its files and takes a fraction of a second of CPU, so it waits for the first
put or relevance search rather than delaying every start (most starts in the tests never
need it); that first request waits for it, on a worker thread.
"""

from __future__ import annotations

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

# Up to this many characters a vector is computed on the event loop: about 75 µs for 1 KiB
# of English (``make bench``, "embedding alone"), about what handing it to a worker thread
# and back costs the loop; a longer text (up to 64 KiB, several milliseconds) goes to a
# thread, so other requests are not held up behind it.
_INLINE_CHARS = 1024


class EmbeddingModel:
    """The model called ``model``, if its package is installed: ``installed`` says so (and
    turns false if it then fails to load, which is logged once)."""

    def __init__(self, *, enabled: bool = True, model: str = DEFAULT_MODEL) -> None:
        self.name = model
        self.installed = enabled and model_installed(model)
        self._encoder: Encoder | None = None
        self._lock = anyio.Lock()

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
        if len(text) <= _INLINE_CHARS:
            row = encoder.embed([text])[0]
        else:
            row = (await anyio.to_thread.run_sync(encoder.embed, [text]))[0]
        return row.tobytes() if row.any() else None

    async def vectors(self, texts: list[str]) -> list[bytes | None]:
        """The vector of each of ``texts``, as :meth:`vector` gives it, computed on a
        worker thread (a batch is milliseconds, or far more with a sentence encoder);
        ``None`` each without the model."""
        encoder = await self._loaded()
        if encoder is None:
            return [None] * len(texts)
        rows = await anyio.to_thread.run_sync(encoder.embed, texts)
        return [row.tobytes() if row.any() else None for row in rows]
