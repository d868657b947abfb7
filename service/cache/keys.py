"""Cache keys: a hash of the model name, its version (the manifest's content hash), the task and the request.

The request is canonicalised before hashing: every parameter present with its
effective value (defaults filled in by the caller), a single input and a
one-item batch written the same way, images by their SHA-256, keys sorted.
A new model version therefore never sees the old version's entries.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

KEY_SCHEMA = 1  # bump when the stored value's format changes: old entries are then never read


def canonical_json(value: Any) -> bytes:
    """Deterministic JSON (sorted keys, no spaces; non-ASCII escaped, so lone surrogates hash too)."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode()


def response_key(
    prefix: str, model: str, version: str, task: str, request: Mapping[str, Any], scope: str = ""
) -> str:
    """The key of ``request``'s answer; ``scope`` (a digest of the caller's API key under CACHE_SCOPE=key)
    keeps one caller's entries out of another's sight."""
    identity = {"schema": KEY_SCHEMA, "model": model, "version": version, "task": task, "request": request}
    if scope:
        identity["scope"] = scope
    return f"{prefix}:{task}:{hashlib.sha256(canonical_json(identity)).hexdigest()}"


def blob_digest(data: bytes) -> str:
    """What an image contributes to a key: its SHA-256 (the bytes themselves would bloat the canonical form)."""
    return hashlib.sha256(data).hexdigest()
