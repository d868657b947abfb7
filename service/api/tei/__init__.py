"""Hugging Face text-embeddings-inference's routes (``/rerank``, ...), with TEI's bodies, answers and errors:
a client written for TEI only changes its URL."""
