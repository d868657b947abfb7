"""Text generation: prompts -> the model's continuous-batching GenerationEngine -> text or a token stream.

The engine owns the decoding loop (KV cache, sampling, stop strings); this
pipeline tokenises and checks prompts, turns request parameters into a
``GenerationRequest``, and makes sure that a caller who goes away cancels
its sequences (``GenerationStream.cancel``), so the engine stops decoding
them at its next step.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from service.engine.generation import (
    GenerationEngine,
    GenerationObserver,
    GenerationRequest,
    GenerationStream,
)
from service.engine.repository import LoadedModel
from service.engine.sampling import SamplingParams
from service.errors import InvalidInputError

from .base import ModelPipeline
from .results import Generation, Outcome, Usage
from .text_inputs import encode_texts, preprocess


@dataclass(frozen=True)
class GenerateParams:
    """Sampling parameters of one request (temperature 0 = greedy); every prompt of it uses them."""

    max_new_tokens: int
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None


@dataclass(frozen=True)
class OpenStream:
    """A running sequence, for streaming: the engine's stream and the prompt's token count."""

    stream: GenerationStream
    prompt_tokens: int


class Generator(ModelPipeline):
    task = "text-generation"

    def __init__(
        self,
        model: LoadedModel,
        *,
        max_running: int,
        max_queue_size: int,
        queue_timeout_s: float,
        max_new_tokens: int,
        observer: GenerationObserver | None = None,
    ) -> None:
        super().__init__(model)
        assert model.tokenizer is not None, "text model without a tokenizer"
        self.tokenizer = model.tokenizer
        self.max_new_tokens = max_new_tokens
        self.engine = GenerationEngine(
            model,
            max_running=max_running,
            max_queue_size=max_queue_size,
            queue_timeout_s=queue_timeout_s,
            observer=observer,
        )

    async def start(self) -> None:
        await self.engine.start()

    async def stop(self, timeout_s: float) -> None:
        await self.engine.stop(drain=True, timeout_s=timeout_s)

    def encode(self, prompts: Sequence[str], fields: Sequence[str]) -> list[list[int]]:
        """Token ids per prompt; a prompt that leaves no room for one new token is the client's error."""
        encoded = []
        for encoding, field in zip(encode_texts(self.tokenizer, prompts), fields, strict=True):
            ids = list(encoding.ids)
            if not ids:
                raise InvalidInputError("prompt encodes to no tokens", field=field, reason="empty")
            if len(ids) >= self.engine.max_context:
                raise InvalidInputError(
                    f"prompt is {len(ids)} tokens; model {self.name!r} holds {self.engine.max_context} "
                    "tokens of context, including at least one new token",
                    field=field,
                    reason="too_long",
                )
            encoded.append(ids)
        return encoded

    def _submit(
        self, ids: list[int], params: GenerateParams, field: str, request_id: str
    ) -> GenerationStream:
        sampling = SamplingParams(
            temperature=params.temperature,
            top_k=params.top_k,
            top_p=params.top_p,
            repetition_penalty=params.repetition_penalty,
            seed=params.seed,
        )
        # Never more than the context holds: generation then ends there, with finish_reason "length".
        room = self.engine.max_context - len(ids)
        request = GenerationRequest(
            prompt_ids=ids,
            max_new_tokens=max(1, min(params.max_new_tokens, self.max_new_tokens, room)),
            sampling=sampling,
            stop=params.stop,
            request_id=request_id,
        )
        try:
            return self.engine.submit(request)
        except ValueError as exc:  # the engine's word for a prompt it cannot fit
            raise InvalidInputError(str(exc), field=field, reason="too_long") from exc

    async def generate(
        self, prompts: Sequence[str], params: GenerateParams, fields: Sequence[str], request_id: str = ""
    ) -> Outcome[Generation]:
        """All prompts decode concurrently in the engine's running batch; results in prompt order."""
        self.engine.admit(len(prompts))  # a full queue refuses before tokenisation is paid for
        encoded = await preprocess(sum(map(len, prompts)), self.encode, prompts, fields)
        self.engine.admit(len(prompts))  # all prompts or none: no await between here and the submits
        streams: list[GenerationStream] = []
        try:
            for ids, field in zip(encoded, fields, strict=True):
                streams.append(self._submit(ids, params, field, request_id))
            finished = await asyncio.gather(*(s.result() for s in streams))
        except BaseException:  # a rejected prompt, or the caller went away: stop the others too
            for stream in streams:
                stream.cancel()
            raise
        results = [
            Generation(r.text, r.finish_reason, r.prompt_tokens, r.completion_tokens) for r in finished
        ]
        usage = Usage(
            input_tokens=sum(r.prompt_tokens for r in results),
            output_tokens=sum(r.completion_tokens for r in results),
        )
        return Outcome(self.name, self.model.version, results, usage)

    async def open_stream(
        self, prompt: str, params: GenerateParams, field: str, request_id: str = ""
    ) -> OpenStream:
        """Admit one prompt and return its live stream; the caller must cancel it if it stops reading."""
        self.engine.admit(1)
        (ids,) = await preprocess(len(prompt), self.encode, [prompt], [field])
        self.engine.admit(1)
        return OpenStream(self._submit(ids, params, field, request_id), len(ids))

    async def warmup(self) -> None:
        await self.generate(["warm"], GenerateParams(max_new_tokens=2, temperature=0.0), ["warm-up"])
