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
import functools
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from service.engine.continuous_batching import GenerationEngine
from service.engine.errors import PromptError
from service.engine.generation_contract import GenerationRequest, GenerationResult, TokenEvent
from service.engine.generation_stream import GenerationStream
from service.engine.repository import LoadedModel
from service.engine.sampling import SamplingParams
from service.engine.structured_output import GrammarError
from service.engine.worker import Permit
from service.errors import InvalidInputError
from service.metadata import ANONYMOUS, RequestMeta
from service.settings import Settings

from .base import Building, ModelPipeline
from .chat_template import ChatTemplate, ChatTemplateError
from .contract import Parameter, TaskContract, TensorSpec, text_input
from .results import Generation, Outcome, Usage
from .text_inputs import encode_texts, preprocess

# Chat templates render here, not on the event loop nor on asyncio's default threads (tokenising, image
# decoding): a flood of slow templates, each up to CHAT_TEMPLATE_TIMEOUT_S, delays only other chats.
_TEMPLATE_THREADS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="chat-template")


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

    @property
    def generated(self) -> int:
        """Tokens generated so far, however the sequence ends (``GenerationStream.generated``)."""
        return self.stream.generated

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
            Parameter(
                "min_tokens", "int", "no end of text or stop string before this many tokens (default 0)"
            ),
            Parameter("guided_json", "string", "the text is JSON following this JSON schema"),
            Parameter("guided_regex", "string", "the text matches this regular expression"),
            Parameter("guided_choice", "strings", "the text is one of these strings"),
            Parameter("guided_grammar", "string", "the text follows this Lark grammar"),
        ),
    )

    @classmethod
    def build(cls, model: LoadedModel, building: Building) -> Generator:
        s = building.settings
        template = (
            s.chat_template.read_text() if s.chat_template is not None else model.manifest.chat_template
        )
        engine = building.workers.generation_engine(model, s, building.metrics)
        return cls(model, engine, template, s)

    def __init__(
        self,
        model: LoadedModel,
        engine: GenerationEngine | Any,
        chat_template: str | None = None,
        settings: Settings | None = None,
    ) -> None:
        """``engine`` runs ``model``: its queue and decoding loop are set up by the caller (``factory.py``);
        ``chat_template`` (Jinja2 source) turns messages into a prompt (None: no chat), rendered within
        ``settings``' CHAT_TEMPLATE_TIMEOUT_S and MAX_TEXT_CHARS (None: the defaults)."""
        super().__init__(model)
        assert model.tokenizer is not None, "text model without a tokenizer"
        self.tokenizer = model.tokenizer
        self.engine = engine
        self.chat_template = None
        if chat_template is not None:
            names = {
                f"{name}_token": model.tokenizer.id_to_token(i)
                for name, i in model.manifest.special_tokens.items()
            }
            self.chat_template = ChatTemplate(
                chat_template,
                {k: v for k, v in names.items() if v is not None},
                *(
                    (settings.chat_template_timeout_s, settings.max_text_chars)
                    if settings is not None
                    else ()
                ),
            )

    async def chat_prompt(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool, kwargs: Mapping[str, Any]
    ) -> str:
        """The prompt of a chat, rendered with the model's template on the template threads (a template
        is bounded in time, not cheap); InvalidInputError naming the field the template could not take,
        or ``model`` when it has no template."""
        if self.chat_template is None:
            raise InvalidInputError(
                f"model {self.name!r} has no chat template (CHAT_TEMPLATE, or the manifest's chat_template), so "
                "chat completions are not supported; use POST /v1/completions with a prompt",
                "model",
                "no_chat_template",
            )
        try:
            return await asyncio.get_running_loop().run_in_executor(
                _TEMPLATE_THREADS,
                functools.partial(self.chat_template.render, messages, add_generation_prompt, kwargs),
            )
        except ChatTemplateError as exc:
            raise InvalidInputError(exc.message, exc.field, "chat_template") from exc

    async def start(self) -> None:
        await self.engine.start()

    @property
    def pending(self) -> int:
        return self.engine.running + self.engine.waiting

    def waiting_by_class(self) -> dict[int, int]:
        return self.engine.waiting_by_class()

    async def stop(self, timeout_s: float) -> None:
        await self.engine.stop(drain=True, timeout_s=timeout_s)

    def encode(self, prompts: Sequence[str]) -> list[list[int]]:
        return [list(encoding.ids) for encoding in encode_texts(self.tokenizer, prompts)]

    def check(self, params: SamplingParams) -> None:
        """What only the model can say of a request's parameters: ``logit_bias`` names its own tokens, and
        a structured output's grammar compiles for its vocabulary (a 400 naming the client's field, with
        the part the grammar engine refused)."""
        structured = params.structured_outputs
        if structured is not None:
            try:
                self.engine.grammars.compile(structured)
            except GrammarError as exc:
                raise InvalidInputError(
                    f"the {structured.kind} constraint does not compile: {exc}",
                    structured.field,
                    "invalid_grammar",
                ) from exc
        vocab = self.engine.vocab_size
        for token, _ in params.logit_bias:
            if token >= vocab:
                raise InvalidInputError(
                    f"token id {token} is not in model {self.name!r}'s vocabulary of {vocab}",
                    "logit_bias",
                    "out_of_range",
                )

    async def _checked(self, params: SamplingParams) -> None:
        """``check``, off the event loop when a grammar is to be compiled (a large schema takes a while)."""
        if params.structured_outputs is None:
            self.check(params)
        else:
            await asyncio.to_thread(self.check, params)

    async def _submit(
        self,
        encoded: list[list[int]],
        params: SamplingParams,
        request_id: str,
        permit: Permit,
        meta: RequestMeta,
    ) -> list[GenerationStream]:
        """Every prompt queued, or none: a prompt the engine refuses is the client's error. Each prompt's
        prefix-cache blocks are its caller's tenant's (``meta.prefix_salt``)."""
        try:
            return await self.engine.admit_all(
                [GenerationRequest(ids, params, request_id, meta.prefix_salt) for ids in encoded],
                permit,
                meta,
            )
        except PromptError as exc:
            raise InvalidInputError(exc.message, "inputs", exc.reason, exc.index) from exc

    async def generate(
        self,
        prompts: Sequence[str],
        params: SamplingParams,
        request_id: str = "",
        on_abandoned: Callable[[Usage], None] | None = None,
        meta: RequestMeta = ANONYMOUS,
    ) -> Outcome[Generation]:
        """All prompts decode concurrently in the engine's running batch; results in prompt order. When the
        request fails or its caller goes away mid-way, ``on_abandoned`` gets what it used until then: the
        prompts' tokens and every token generated."""
        await self._checked(params)
        with self.engine.reserve(len(prompts), meta) as permit:  # a full queue refuses before tokenising
            encoded = await preprocess(sum(map(len, prompts)), self.encode, prompts)
            streams = await self._submit(encoded, params, request_id, permit, meta)
            try:
                finished = await asyncio.gather(*(s.result() for s in streams))
            except BaseException:  # a failed sequence, or the caller went away: stop the others too
                for stream in streams:
                    stream.cancel()
                if on_abandoned is not None:
                    on_abandoned(Usage(sum(map(len, encoded)), sum(s.generated for s in streams)))
                raise
        results = [generation_of(r) for r in finished]
        return Outcome(self.name, self.model.version, results, Usage.of_generations(results))

    async def open_stream(
        self, prompt: str, params: SamplingParams, request_id: str = "", meta: RequestMeta = ANONYMOUS
    ) -> OpenStream:
        """Admit one prompt and return its live stream; the caller must cancel it if it stops reading."""
        await self._checked(params)
        with self.engine.reserve(1, meta) as permit:
            (ids,) = await preprocess(len(prompt), self.encode, [prompt])
            (stream,) = await self._submit([ids], params, request_id, permit, meta)
            return OpenStream(stream, len(ids))

    async def warmup(self) -> None:
        await self.generate(["warm"], SamplingParams(max_new_tokens=2, temperature=0.0))
