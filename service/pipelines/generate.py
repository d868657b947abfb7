"""Text generation: prompts -> the model's continuous-batching GenerationEngine -> text or a token stream.

The engine owns the decoding loop (KV cache, sampling, stop strings) and what
fits the model (``check_prompt``, the clamp of ``max_new_tokens`` to the
context); this pipeline tokenises prompts, names the index of a prompt the
engine refuses, and makes sure that a caller who goes away
cancels its sequences (``GenerationStream.cancel``), so the engine stops
decoding them at its next step.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from service.engine.continuous_batching import GenerationEngine
from service.engine.errors import PromptError
from service.engine.generation_contract import GenerationRequest, GenerationResult, TokenEvent
from service.engine.generation_stream import GenerationStream
from service.engine.repository import LoadedModel
from service.engine.sampling import SamplingParams
from service.engine.worker import Permit
from service.errors import InvalidInputError

from .base import Building, ModelPipeline
from .contract import Parameter, TaskContract, TensorSpec, text_input
from .results import Generation, Outcome, Usage
from .text_inputs import encode_texts, preprocess


def generation_of(r: GenerationResult) -> Generation:
    """The engine's result as the one generation type every door renders."""
    return Generation(
        r.text, r.finish_reason, r.prompt_tokens, r.completion_tokens, r.logprobs, r.prompt_logprobs
    )


@dataclass(frozen=True)
class OpenStream:
    """A running sequence, for streaming: its token events, then its ``Generation``; ``cancel`` stops it."""

    stream: GenerationStream
    prompt_tokens: int

    def __aiter__(self) -> AsyncIterator[TokenEvent]:
        return self.stream.__aiter__()

    async def result(self) -> Generation:
        return generation_of(await self.stream.result())

    def cancel(self) -> None:
        self.stream.cancel()


class Generator(ModelPipeline):
    contract = TaskContract(
        "text-generation",
        "gpt",
        (text_input("prompt", "UTF-8 prompt"),),
        (
            TensorSpec("text", "BYTES", "the completion, without the prompt", value=lambda g: g.text),
            TensorSpec("finish_reason", "BYTES", "length | stop | eos", value=lambda g: g.finish_reason),
        ),
        (
            Parameter(
                "max_new_tokens",
                "int",
                "tokens to generate (default 64, at most MAX_NEW_TOKENS)",
                ("max_tokens", "max_new_tokens"),
            ),
            Parameter("temperature", "float", "0 = greedy (default 1)"),
            Parameter("top_k", "int", "0 = off"),
            Parameter("top_p", "float", "1 = off"),
            Parameter("repetition_penalty", "float", "1 = off"),
            Parameter("seed", "int", "reproducible sampling"),
            Parameter("stop", "strings", "generation ends before the first"),
        ),
    )

    @classmethod
    def build(cls, model: LoadedModel, building: Building) -> Generator:
        s = building.settings
        engine = GenerationEngine(
            model,
            max_running=s.max_running_sequences,
            max_queue_size=s.max_queue_size,
            queue_timeout_s=s.queue_timeout_s,
            observer=building.metrics.generation_observer(model.name)
            if building.metrics is not None
            else None,
        )
        return cls(model, engine)

    def __init__(self, model: LoadedModel, engine: GenerationEngine) -> None:
        """``engine`` runs ``model``: its queue and decoding loop are set up by the caller (``factory.py``)."""
        super().__init__(model)
        assert model.tokenizer is not None, "text model without a tokenizer"
        self.tokenizer = model.tokenizer
        self.engine = engine

    async def start(self) -> None:
        await self.engine.start()

    @property
    def pending(self) -> int:
        return self.engine.running + self.engine.waiting

    async def stop(self, timeout_s: float) -> None:
        await self.engine.stop(drain=True, timeout_s=timeout_s)

    def encode(self, prompts: Sequence[str]) -> list[list[int]]:
        return [list(encoding.ids) for encoding in encode_texts(self.tokenizer, prompts)]

    def _submit(
        self, encoded: list[list[int]], params: SamplingParams, request_id: str, permit: Permit
    ) -> list[GenerationStream]:
        """Every prompt queued, or none: a prompt the engine refuses is the client's error."""
        try:
            return self.engine.submit_all(
                [GenerationRequest(ids, params, request_id) for ids in encoded], permit
            )
        except PromptError as exc:
            raise InvalidInputError(exc.message, "inputs", exc.reason, exc.index) from exc

    async def generate(
        self, prompts: Sequence[str], params: SamplingParams, request_id: str = ""
    ) -> Outcome[Generation]:
        """All prompts decode concurrently in the engine's running batch; results in prompt order."""
        with self.engine.reserve(
            len(prompts)
        ) as permit:  # a full queue refuses before tokenisation is paid for
            encoded = await preprocess(sum(map(len, prompts)), self.encode, prompts)
            streams = self._submit(encoded, params, request_id, permit)
            try:
                finished = await asyncio.gather(*(s.result() for s in streams))
            except BaseException:  # a failed sequence, or the caller went away: stop the others too
                for stream in streams:
                    stream.cancel()
                raise
        results = [generation_of(r) for r in finished]
        return Outcome(self.name, self.model.version, results, Usage.of_generations(results))

    async def open_stream(self, prompt: str, params: SamplingParams, request_id: str = "") -> OpenStream:
        """Admit one prompt and return its live stream; the caller must cancel it if it stops reading."""
        with self.engine.reserve(1) as permit:
            (ids,) = await preprocess(len(prompt), self.encode, [prompt])
            (stream,) = self._submit([ids], params, request_id, permit)
            return OpenStream(stream, len(ids))

    async def warmup(self) -> None:
        await self.generate(["warm"], SamplingParams(max_new_tokens=2, temperature=0.0))
