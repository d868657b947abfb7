"""What the locust users send: the load mix from the environment, the inputs, and prompts that fit.

The environment variables are listed in ``locustfile.py``'s docstring; this module reads those that
shape the requests (``LOAD_MIX``, ``LOAD_POOL_SIZE``, ``LOAD_BATCH``, ``LOAD_MAX_NEW_TOKENS``,
``LOAD_WAIT``, and ``DATA_DIR`` through ``loadtest_data``) once, when the locustfile imports it.
"""

from __future__ import annotations

import logging
import os
import random
from typing import Any

import requests
from loadtest_data import MAX_PROMPT_CHARS, Inputs, fit_prompt, load_inputs

log = logging.getLogger("loadtest")

MIX = os.environ.get("LOAD_MIX", "cold").strip().lower()
if MIX not in ("warm", "cold"):
    raise ValueError(f"LOAD_MIX must be warm or cold, not {MIX!r}")
POOL_SIZE = int(os.environ.get("LOAD_POOL_SIZE", "16"))
BATCH = max(1, min(32, int(os.environ.get("LOAD_BATCH", "1"))))
MAX_NEW_TOKENS = max(1, min(256, int(os.environ.get("LOAD_MAX_NEW_TOKENS", "32"))))
_wait = [float(x) for x in os.environ.get("LOAD_WAIT", "0.05,0.25").split(",")]
WAIT_MIN, WAIT_MAX = _wait[0], _wait[-1]

ALL_INPUTS: Inputs = load_inputs()
INPUTS: Inputs = ALL_INPUTS.pool(POOL_SIZE) if MIX == "warm" else ALL_INPUTS
HEADERS: dict[str, str] = {} if MIX == "warm" else {"Cache-Control": "no-cache"}

# Prompts must leave room for the completion in the generation model's context (a longer prompt is a
# 422). The context length comes from GET /v1/models. A byte-level BPE never makes more tokens than
# bytes, and the prompts are ASCII, so one character per token is a bound, not a guess (a small
# vocabulary, like the tiny test model's, gets close to it).
CHARS_PER_TOKEN = 1.0
_fitted_prompts: list[str] | None = None


def generation_context(host: str) -> int:
    """max_sequence_length of the default text-generation model (64, the smallest built, if unknown)."""
    try:
        models = requests.get(f"{host.rstrip('/')}/v1/models", timeout=10).json()["data"]
        for model in models:
            if "text-generation" in (model.get("default_for") or []):
                return int(model["limits"]["max_sequence_length"])
    except (requests.RequestException, ValueError, KeyError, TypeError) as exc:
        log.warning("could not read the generation model's context from /v1/models (%s): assuming 64", exc)
    return 64


def generation_prompts(host: str) -> list[str]:
    """The prompts, cut to fit the served generation model with MAX_NEW_TOKENS to spare (computed once)."""
    global _fitted_prompts
    if _fitted_prompts is None:
        context = generation_context(host)
        budget = max(context - MAX_NEW_TOKENS, context // 4) - 2
        max_chars = int(max(16, min(MAX_PROMPT_CHARS, budget * CHARS_PER_TOKEN)))
        _fitted_prompts = [fit_prompt(p, max_chars) for p in INPUTS.prompts]
        log.info("generation context %d tokens: prompts cut to at most %d characters", context, max_chars)
    return _fitted_prompts


def pick(items: list[Any]) -> tuple[int, Any]:
    i = random.randrange(len(items))
    return i, items[i]


def picks(items: list[Any], n: int = BATCH) -> list[Any]:
    return [items[random.randrange(len(items))] for _ in range(n)]


def seed_for(index: int) -> int:
    """Warm: one fixed seed per pooled prompt (the same request each time); cold: a fresh one."""
    return index if MIX == "warm" else random.randrange(2**31)
