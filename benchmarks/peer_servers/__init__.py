"""The peer servers of ``benchmarks/peers.py``: the same classifier behind LitServe and Ray Serve.

Run with the python of a separate venv (``pip install -e ".[peers]"``), never the service's; each
script imports only its framework, numpy, onnxruntime and tokenizers (``classifier.py``).
"""
