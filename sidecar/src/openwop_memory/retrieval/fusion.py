"""Fusion: one relevance score in [0, 1] per row of a scope, from its keyword and meaning
scores.

A placeholder with the seam's signature (the recall work owns the real formula): each
side normalised by its best visible score, weighted keywords 0.7, meaning 0.3; a row no
query term matches and with a cosine at or below :data:`MEANING_FLOOR` scores 0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

KEYWORD_WEIGHT = 0.7
MEANING_FLOOR = 0.1
"""A cosine at or below this is no evidence of relatedness."""


def fuse(
    *,
    keyword: npt.NDArray[np.float32],
    meaning: npt.NDArray[np.float32] | None,
    created_us: npt.NDArray[np.int64],
    visible: npt.NDArray[np.bool_],
    query: str,
) -> npt.NDArray[np.float32]:
    """A score in [0, 1] per row (arrays aligned to the scope's rows in seq order:
    ``keyword`` BM25, 0 where no term matches; ``meaning`` cosine in [-1, 1], or ``None``
    without a model); 0 means not relevant, and a row not ``visible`` scores 0.
    Deterministic: the same arrays give the same scores."""
    import numpy as np

    del created_us, query  # unused by the placeholder
    key = np.where(visible, keyword, np.float32(0)).astype(np.float32)
    best = float(key.max()) if len(key) else 0.0
    score = (key / np.float32(best)) if best > 0 else np.zeros_like(key)
    if meaning is None:
        result: npt.NDArray[np.float32] = np.clip(score, 0, 1).astype(np.float32)
        return result
    near = np.where(visible & (meaning > MEANING_FLOOR), meaning, np.float32(0))
    top = float(near.max()) if len(near) else 0.0
    near = (near / np.float32(top)) if top > 0 else np.zeros_like(key)
    fused = np.float32(KEYWORD_WEIGHT) * score + np.float32(1 - KEYWORD_WEIGHT) * near
    clipped: npt.NDArray[np.float32] = np.clip(fused, 0, 1).astype(np.float32)
    return clipped
