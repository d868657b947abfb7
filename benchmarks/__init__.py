"""Benchmarks: side-by-side ratios measured in one run, appended as dated tables to benchmarks/RESULTS.md.

Run one (``python benchmarks/kv_cache.py``) or all (``python benchmarks/run_all.py --json OUT``);
every script takes ``--models DIR`` (default ``models/``) and ``--quick`` (seconds, for the tests).
"""
