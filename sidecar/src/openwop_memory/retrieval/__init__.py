"""Retrieval: what turns a query into ranked entries, between the service and storage.

- :mod:`.text`: the terms of an entry and of a query (keyword relevance);
- :mod:`.encoders`: embedding models by name (:func:`.encoders.load_encoder`);
- :mod:`.fusion`: one relevance score in [0, 1] per row from keywords and meaning.

Nothing here is imported by storage, and nothing here imports numpy at import time (a
sidecar without the ``search`` extra never loads it).
"""
