"""Serving engine: batching, sampling and model sessions, independent of HTTP."""
