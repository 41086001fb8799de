"""Meaning for relevance: the embedding model of the ``search`` extra, the vectors it gives,
and how they are compared. Nothing here touches a database; the backends and the service
use it.

**The model** is WordLlama's ``l2_supercat``, whose weights (a 32,000 x 256 float16 table,
one row per token of Llama 2's tokenizer) and tokenizer ship inside the ``wordllama``
wheel, truncated to its first :data:`DIMENSIONS` dimensions (WordLlama is trained so that
a prefix of its dimensions is an embedding too: its own ``trunc_dim=64``). An embedding is
the mean of the rows of its tokens, as WordLlama's own ``embed`` computes it: a static
model, cheap on CPU, with nothing downloaded at run time.
The files are read from the installed package (its loader would look for the tokenizer
under ``tokenizer/`` while the wheel ships ``tokenizers/``, and fetch it from the network);
the package's own modules are never imported (their import configures the root logger).

The text is embedded as its words, split on whitespace: each word is tokenized once (a
cache keeps the token ids of recent words), which is what makes a put cheap. For text
whose words are separated by single spaces this is exactly WordLlama's embedding of it
(``tests/storage/test_semantic.py`` checks it); a run of whitespace counts as one space.

**Vectors** are stored as :data:`VECTOR_BYTES` signed bytes: the unit vector scaled so
that its largest component is 127, then rounded. Similarity is the cosine of two such
vectors, computed from integers so that it is exact: each product is at most 127², so a
dot product of 64 (or even 384) of them stays below 2²⁴. The stored int8 rows are summed in
32-bit integers (:func:`similarities`), and float32 arithmetic, where a float32 copy is
multiplied, holds such a sum exactly in any order of summation. The same query and the
same vectors therefore give the same scores, on any machine and after any restart.
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Iterator, Sequence
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy comes with the extra; this module imports it only when loading
    import numpy as np
    import numpy.typing as npt

MODEL = "wordllama-l2_supercat-64"
"""The name capabilities give the embedding model (``embeddingModel``)."""

DIMENSIONS = 64
"""How many of the model's 256 dimensions are kept. 64 rather than 256: a scope's matrix is
a quarter of the size (27 MiB for 100,000 entries, which stays in this machine's CPU
cache) and its product with a query about 8 times faster; a put's embedding gathers a
quarter of the floats; the vector is 64 bytes on disk. The labelled set's recall@10 is no
lower at 64 (``make bench``; docs/benchmarks.md), though WordLlama's own retrieval scores (MTEB
CQADupStack: 18.7 at 64, 24.2 at 256) are. Changing it changes every vector: entries
stored with another length are left out of the ranking by meaning."""
VECTOR_BYTES = DIMENSIONS  # one signed byte a dimension
RANK_DIMENSIONS = DIMENSIONS

_PACKAGE = "wordllama"
_WEIGHTS = ("weights", "l2_supercat_256.safetensors")
_TOKENIZER = ("tokenizers", "l2_supercat_tokenizer_config.json")
_TENSOR = "embedding.weight"
# Distinct words whose token ids are kept; the cache is emptied when it is full (a put's
# words are looked up again at the cost of one tokenizer call each). A cached word costs
# about 400 bytes, and entries full of ids, numbers and hashes bring new words all the time:
# 16,384 keeps a sidecar's common vocabulary for a few MiB (``make bench``'s "RSS after
# load" row, whose entries each carry a word of their own).
_WORD_CACHE = 16_384


class ModelUnavailableError(Exception):
    """The ``search`` extra is not installed, or its files cannot be read (the message says
    which, without content)."""


def _package_files() -> tuple[Path, Path]:
    """The weights and tokenizer files inside the installed ``wordllama`` package, found
    without importing it.

    :raises ModelUnavailableError: the package, or one of its files, is missing.
    """
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelUnavailableError("the search extra is not installed (no wordllama package)")
    root = Path(next(iter(spec.submodule_search_locations)))
    files = (root.joinpath(*_WEIGHTS), root.joinpath(*_TOKENIZER))
    for path in files:
        if not path.is_file():
            raise ModelUnavailableError(f"the wordllama package has no {path.name}")
    return files


def model_installed() -> bool:
    """Whether the extra's packages and the model's files are present (cheap: nothing is
    loaded)."""
    try:
        _package_files()
    except ModelUnavailableError:
        return False
    return all(
        importlib.util.find_spec(name) is not None
        for name in ("numpy", "tokenizers", "safetensors")
    )


class Embedder:
    """The loaded model. Thread-safe: puts may embed on worker threads."""

    def __init__(self, tokenizer: Any, weights: npt.NDArray[np.float32]) -> None:
        self._tokenizer = tokenizer
        self._weights = weights
        self._word_ids: dict[str, list[int]] = {}
        self._lock = threading.Lock()

    def _ids(self, word: str) -> list[int]:
        ids = self._word_ids.get(word)
        if ids is None:
            ids = self._tokenizer.encode(word, add_special_tokens=False).ids
            with self._lock:
                if len(self._word_ids) >= _WORD_CACHE:
                    self._word_ids.clear()
                self._word_ids[word] = ids
        return ids

    def unit(self, text: str) -> npt.NDArray[np.float32] | None:
        """The unit embedding of ``text`` (float32, :data:`DIMENSIONS`); ``None`` for text
        without a word."""
        import numpy as np

        ids = list(chain.from_iterable(map(self._ids, text.split())))
        if not ids:
            return None
        total = np.take(self._weights, ids, axis=0).sum(axis=0, dtype=np.float32)
        norm = float(np.sqrt(np.dot(total, total)))
        if norm == 0.0:
            return None
        result: npt.NDArray[np.float32] = total / np.float32(norm)
        return result

    def vector(self, text: str) -> bytes | None:
        """The stored form of ``text``'s embedding (:data:`VECTOR_BYTES` signed bytes, see
        the module's docstring); ``None`` for text without a word."""
        unit = self.unit(text)
        if unit is None:
            return None
        return quantize(unit)


def quantize(unit: npt.NDArray[np.float32]) -> bytes:
    """A unit vector as signed bytes, its largest component scaled to 127."""
    import numpy as np

    scale = np.float32(127.0) / np.abs(unit).max()
    return bytes(np.rint(unit * scale).astype(np.int8).tobytes())


def load() -> Embedder:
    """Load the model from the installed package's files (no network, no cache directory).

    :raises ModelUnavailableError: the extra is missing or its files cannot be read.
    """
    weights_path, tokenizer_path = _package_files()
    try:
        import numpy as np
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer
    except ImportError as exc:
        raise ModelUnavailableError(f"the search extra is incomplete: {exc.name}") from None
    try:
        tokenizer = Tokenizer.from_file(str(tokenizer_path))
        table = load_file(str(weights_path))[_TENSOR]
    except Exception as exc:  # noqa: BLE001 - any unreadable file means the same thing here
        raise ModelUnavailableError(f"cannot read the model: {type(exc).__name__}") from None
    if len(table.shape) != 2 or table.shape[1] < DIMENSIONS:
        raise ModelUnavailableError(f"unexpected weights shape {table.shape}")
    return Embedder(tokenizer, np.ascontiguousarray(table[:, :DIMENSIONS], dtype=np.float32))


def query_vector(vector: bytes) -> npt.NDArray[np.float32]:
    """A stored vector's first :data:`RANK_DIMENSIONS` components, as the float32 integers
    a similarity is computed with."""
    import numpy as np

    return np.frombuffer(vector, dtype=np.int8)[:RANK_DIMENSIONS].astype(np.float32)


# Rows of an int8 matrix widened to float32 at a time by :func:`norms_of`: a block of
# 2,048 rows of 384 dimensions (3 MiB) stays in cache, where a scope's whole matrix widened
# at once would take four times its bytes.
_BLOCK_ROWS = 2048


def _widened(matrix: npt.NDArray[Any]) -> Iterator[tuple[int, npt.NDArray[np.float32]]]:
    """``matrix``'s rows as float32, :data:`_BLOCK_ROWS` at a time, each block with the
    index of its first row. One buffer serves every block: a block is valid until the
    next is asked for."""
    import numpy as np

    buffer = np.empty((min(_BLOCK_ROWS, len(matrix)), matrix.shape[1]), np.float32)
    for start in range(0, len(matrix), _BLOCK_ROWS):
        rows = matrix[start : start + _BLOCK_ROWS]
        block = buffer[: len(rows)]
        block[...] = rows
        yield start, block


def similarities(
    matrix: npt.NDArray[Any], norms: npt.NDArray[np.float64], query: npt.NDArray[np.float32]
) -> npt.NDArray[np.float64]:
    """Each row's cosine with ``query`` times ``|query|`` (a constant for one query, so the
    order is the cosine's): ``matrix`` holds stored vectors as int8 (or as float32
    integers), ``query`` as float32 integers of int8's range (see :func:`query_vector`),
    ``norms`` the rows' lengths. Exact: see the module's docstring.

    An int8 matrix is multiplied as it is stored, by SimSIMD's int8 dot product (the CPU's
    integer SIMD instructions where it has them, integers summed in 32 bits): exact, so
    the same on any CPU whichever kernel it picks. On this project's 2-core machine,
    100,000 rows took 1.45 ms of 384 and 0.5 ms of 64, where widening them to float32 a
    block at a time for numpy's BLAS took 6.2 and 1.1 ms.
    """
    import numpy as np

    if len(matrix) == 0:
        return np.empty(0, np.float64)
    if matrix.dtype != np.int8:
        dots = (matrix @ query).astype(np.float64)  # integers below 2**24: exact in float32
    else:
        import simsimd

        stored = np.ascontiguousarray(matrix)
        asked = query.astype(np.int8).reshape(1, -1)
        found = simsimd.cdist(asked, stored, metric="dot", dtype="int8")
        dots = np.asarray(found, np.float64)[0]
    result: npt.NDArray[np.float64] = dots / norms
    return result


def norms_of(matrix: npt.NDArray[Any]) -> npt.NDArray[np.float64]:
    """The length of each row of ``matrix`` (integers, int8 or float32), from its exact sum
    of squares."""
    import numpy as np

    # A block at a time, as :func:`similarities` reads: widening a 100,000-row scope at
    # once took a 147 MiB float32 copy, whose first use alone cost a third of a second.
    squares = np.empty(len(matrix), np.float32)
    for start, block in _widened(matrix):
        # Integers below 2**24: exact in float32, whatever the order of summation.
        np.einsum("ij,ij->i", block, block, out=squares[start : start + len(block)])
    result: npt.NDArray[np.float64] = np.sqrt(squares.astype(np.float64))
    # An all-zero row cannot come from quantize (its largest component is 127).
    result[result == 0.0] = 1.0
    return result


class WordLlamaEncoder:
    """:class:`Embedder` as an :class:`~openwop_memory.retrieval.encoders.Encoder`."""

    name = MODEL
    dimensions = DIMENSIONS
    # About 75 µs for 1 KiB of English (``make bench``, "embedding alone"), about what
    # handing it to a worker thread and back costs the loop; a longer text (up to 64 KiB,
    # several milliseconds) goes to a thread, so other requests are not held up behind it.
    inline_chars = 1024

    def __init__(self, embedder: Embedder) -> None:
        self._embedder = embedder

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.int8]:
        import numpy as np

        out = np.zeros((len(texts), DIMENSIONS), dtype=np.int8)
        for row, text in enumerate(texts):
            vector = self._embedder.vector(text)
            if vector is not None:
                out[row] = np.frombuffer(vector, dtype=np.int8)
        return out
