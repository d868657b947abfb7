"""The generation engine's public contract (docs/GENERATION_ENGINE_API.md): what goes in, what comes out.

A caller submits a ``GenerationRequest`` and gets a ``GenerationStream``
(``generation_stream.py``) of ``TokenEvent``s ending in a ``GenerationResult``;
metrics hook in through a ``GenerationObserver``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .errors import EngineError
from .sampling import SamplingParams, TokenLogprob
from .scheduling import ClassObserver, NullClassObserver

__all__ = [
    "GenerationCancelledError",
    "GenerationObserver",
    "GenerationRequest",
    "GenerationResult",
    "NullGenerationObserver",
    "TokenEvent",
    "TokenLogprob",
]


@dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: list[int]  # already tokenized; GenerationEngine.check_prompt says whether it fits
    sampling: SamplingParams  # max_new_tokens, stop strings, and how each token is picked
    request_id: str = ""
    cache_salt: str = ""  # the caller's prefix-cache tenant (``PrefixCache``): "" shares the blocks


@dataclass(frozen=True)
class TokenEvent:
    """One generated token; ``text`` may be "" while a character or a possible stop string is incomplete."""

    index: int  # 0-based position in the completion
    token_id: int
    text: str  # what this token adds; all event texts joined == the result text
    logprob: TokenLogprob | None = (
        None  # with SamplingParams.logprobs: this token's and the top alternatives'
    )


@dataclass(frozen=True)
class GenerationResult:
    token_ids: list[int]  # every generated id, eos included when it ended the sequence
    text: str
    finish_reason: str  # "length" | "stop" | "eos" | "deadline" (the client's deadline passed mid-way)
    prompt_tokens: int
    completion_tokens: int
    time_to_first_token_s: float
    seconds: float
    logprobs: list[TokenLogprob] | None = None  # one per token_ids entry, with SamplingParams.logprobs
    # With SamplingParams.prompt_logprobs: one per prompt token, the first's logprob None (nothing predicts it).
    prompt_logprobs: list[TokenLogprob] | None = None


class GenerationCancelledError(EngineError):
    """``result()`` of a stream whose client went away (``cancel()`` or an abandoned iteration)."""

    def __init__(self, model: str) -> None:
        super().__init__(f"generation on model {model!r} was cancelled")
        self.model = model


class GenerationObserver(ClassObserver, Protocol):
    """Where metrics hook in; called on the event loop. Every hook is optional (``worker.with_defaults``).

    Reject reasons: ``"queue_full"``, ``"timeout"``, ``"closed"``.
    """

    def on_first_token(self, seconds: float) -> None: ...

    def on_token(self, inter_token_seconds: float) -> None: ...

    def on_step(self, batch_size: int, seconds: float) -> None: ...

    def on_finish(self, reason: str, completion_tokens: int) -> None: ...

    def on_cancel(self) -> None: ...

    def on_reject(self, reason: str) -> None: ...

    def on_depth(self, waiting: int, running: int) -> None: ...

    def on_prefix_cache(self, queried_tokens: int, hit_tokens: int, blocks: int, bytes: int) -> None:
        """After a prefill: prompt tokens looked up and found in the prefix cache since the last call, and
        what it holds now."""

    def on_speculation(self, proposed_tokens: int, accepted_tokens: int) -> None:
        """After a decoding step with speculation: n-gram tokens proposed, and of those, accepted."""


class NullGenerationObserver(NullClassObserver):
    """No-op observer; subclass it and override only the hooks you need."""

    def on_first_token(self, seconds: float) -> None:
        pass

    def on_token(self, inter_token_seconds: float) -> None:
        pass

    def on_step(self, batch_size: int, seconds: float) -> None:
        pass

    def on_finish(self, reason: str, completion_tokens: int) -> None:
        pass

    def on_cancel(self) -> None:
        pass

    def on_reject(self, reason: str) -> None:
        pass

    def on_depth(self, waiting: int, running: int) -> None:
        pass

    def on_prefix_cache(self, queried_tokens: int, hit_tokens: int, blocks: int, bytes: int) -> None:
        pass

    def on_speculation(self, proposed_tokens: int, accepted_tokens: int) -> None:
        pass
