"""Retrieval: what turns a query into ranked entries, between the service and storage.

- :mod:`.text`: the terms of an entry and of a query (keyword relevance);
- :mod:`.encoders`: embedding models by name (:func:`.encoders.load_encoder`);
- :mod:`.fusion`: one relevance score in [0, 1] per row from keywords and meaning;
- :mod:`.nearest`: the nearest entries of a scope by meaning, from cached vectors;
- :mod:`.search`: relevance search over any backend's three primitives (keyword
  candidates, vectors written after a position, a candidate check), written once.

It sits above storage (it calls those primitives) and below the service; storage imports
nothing of it. Nothing here imports numpy at import time (a sidecar without the ``search``
extra never loads it).
"""
