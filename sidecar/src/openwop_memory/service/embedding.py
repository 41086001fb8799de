"""The embedding model as the service uses it: present or not, loaded once on first need,
and a text's vector computed on the event loop or, for long text, on a worker thread.

Loading reads about 18 MB of files and takes a fraction of a second of CPU, so it waits for
the first put or relevance search rather than delaying every start (most starts in the
tests never need it); that first request waits for it, on a worker thread.
"""

from __future__ import annotations

import anyio
import anyio.to_thread
import structlog

from ..retrieval.encoders import wordllama as semantic

log = structlog.get_logger("openwop_memory.service")

# Up to this many characters a vector is computed on the event loop: about 75 µs for 1 KiB
# of English (``make bench``, "embedding alone"), about what handing it to a worker thread
# and back costs the loop; a longer text (up to 64 KiB, several milliseconds) goes to a
# thread, so other requests are not held up behind it.
_INLINE_CHARS = 1024


class EmbeddingModel:
    """The ``search`` extra's model, if installed: ``installed`` says so (and turns false if
    it then fails to load, which is logged once)."""

    def __init__(self, *, enabled: bool = True) -> None:
        self.installed = enabled and semantic.model_installed()
        self._embedder: semantic.Embedder | None = None
        self._lock = anyio.Lock()

    async def _loaded(self) -> semantic.Embedder | None:
        if self._embedder is not None or not self.installed:
            return self._embedder
        async with self._lock:
            if self._embedder is None and self.installed:
                try:
                    self._embedder = await anyio.to_thread.run_sync(semantic.load)
                except semantic.ModelUnavailableError as exc:
                    self.installed = False
                    log.warning(
                        "embedding_model_unavailable",
                        reason=str(exc),
                        hint="relevance ranks by keywords only; reinstall the search extra",
                    )
                else:
                    log.info("embedding_model_loaded", model=semantic.MODEL)
        return self._embedder

    async def vector(self, text: str) -> bytes | None:
        """The stored vector of ``text`` (:meth:`~retrieval.encoders.wordllama.Embedder.vector`);
        ``None`` without the model or for text without a word."""
        embedder = await self._loaded()
        if embedder is None:
            return None
        if len(text) <= _INLINE_CHARS:
            return embedder.vector(text)
        return await anyio.to_thread.run_sync(embedder.vector, text)
