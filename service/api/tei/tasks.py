"""Hugging Face's task format, ``{"inputs": ..., "parameters": {...}}``, at ``POST /models/{model}`` (and
``/models/{model}/pipeline/{task}``, the Inference API's path for embedders): the URL that
``huggingface_hub.InferenceClient(base_url=...)`` posts every task to, as it does to a TEI or an Inference
Endpoint. The model's own task says how its body reads; each answer is in the shape the client parses.

feature-extraction (and sentence-similarity on it), text-classification, token-classification,
question-answering, translation, text-generation (TGI's parameters; a parameter this service cannot
honour answers TGI's "model_kwargs are not used" 400, which the client reads to retry without it) and
image-classification (the image as the raw body, or base64 in ``inputs``). Errors are TEI's.
"""

from __future__ import annotations

from typing import Any, Literal

from litestar import Controller, post
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from service.api.http.caching import cache_control
from service.api.http.deps import HttpRequest, Services
from service.api.http.disconnect import unless_disconnected
from service.api.http.fields import FieldNames, one_or_many
from service.api.http.guards import read_json
from service.api.http.meta import request_meta
from service.api.http.request_id import request_id_of
from service.api.tei.errors import TEI_ERRORS, TEI_EXCEPTION_HANDLERS
from service.api.tei.schemas import SimilarityInputs
from service.errors import InvalidInputError, MalformedBodyError
from service.inference import CUT_RIGHT, DOCUMENTS, QUERIES, ServedModel, Truncation, image_bytes
from service.inference.params import decoding_params, sampling_params

Texts = str | list[str]


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _not_empty(value: Any) -> Any:
    if isinstance(value, list) and not value:
        raise PydanticCustomError("too_short", "`inputs` cannot be empty")
    return value


class TextsBody(Body):
    inputs: Texts

    _inputs = field_validator("inputs", mode="before")(_not_empty)

    @property
    def texts(self) -> list[str]:
        return [self.inputs] if isinstance(self.inputs, str) else list(self.inputs)

    @property
    def single(self) -> bool:
        return isinstance(self.inputs, str)

    def field_names(self) -> FieldNames:
        return one_or_many("inputs", "inputs", self.single)


class EmbeddingParameters(Body):
    normalize: bool | None = None
    truncate: bool | None = None
    truncation_direction: Literal["left", "right", "Left", "Right"] | None = None
    dimensions: int | None = Field(default=None, ge=1)
    encoding_format: Literal["float"] | None = None
    prompt_name: None = None

    @property
    def truncation(self) -> Truncation:
        side = (self.truncation_direction or "right").lower()
        if self.truncate is None and side == "right":
            return CUT_RIGHT
        return Truncation(self.truncate is not False, "left" if side == "left" else "right")


class EmbeddingBody(TextsBody):
    parameters: EmbeddingParameters = Field(default_factory=EmbeddingParameters)


class SimilarityBody(Body):
    inputs: SimilarityInputs
    parameters: EmbeddingParameters = Field(default_factory=EmbeddingParameters)


class ClassificationParameters(Body):
    top_k: int | None = Field(default=None, ge=1)
    function_to_apply: Literal["softmax"] | None = None  # the model's probabilities are its softmax


class ClassificationBody(TextsBody):
    parameters: ClassificationParameters = Field(default_factory=ClassificationParameters)


class TokenParameters(Body):
    aggregation_strategy: str | None = None
    ignore_labels: list[str] | None = None
    stride: None = None


class TokenBody(TextsBody):
    parameters: TokenParameters = Field(default_factory=TokenParameters)


class QAInput(Body):
    question: str
    context: str


class QAParameters(Body):
    top_k: Literal[1] | None = None
    align_to_words: None = None
    doc_stride: None = None
    handle_impossible_answer: Literal[False] | None = None
    max_answer_len: None = None
    max_question_len: None = None
    max_seq_len: None = None


class QABody(Body):
    inputs: QAInput | list[QAInput]
    parameters: QAParameters = Field(default_factory=QAParameters)

    _inputs = field_validator("inputs", mode="before")(_not_empty)

    @property
    def pairs(self) -> list[tuple[str, str]]:
        items = [self.inputs] if isinstance(self.inputs, QAInput) else self.inputs
        return [(i.question, i.context) for i in items]


class GenerateParameters(Body):
    max_new_tokens: int | None = None
    num_beams: int | None = None


class TranslationParameters(Body):
    src_lang: None = None
    tgt_lang: None = None
    clean_up_tokenization_spaces: bool | None = None
    truncation: Literal["do_not_truncate", "longest_first", "only_first"] | None = None
    generate_parameters: GenerateParameters | None = None


class TranslationBody(TextsBody):
    parameters: TranslationParameters = Field(default_factory=TranslationParameters)


# TGI's parameters this service honours; any other given (not null, not false) is answered with TGI's
# "model_kwargs are not used" 400, which huggingface_hub reads to drop it and retry.
TGI_HONOURED = {
    "max_new_tokens",
    "temperature",
    "top_k",
    "top_p",
    "repetition_penalty",
    "seed",
    "stop",
    "do_sample",
}
TGI_KNOWN = TGI_HONOURED | {
    "return_full_text",
    "adapter_id",
    "best_of",
    "decoder_input_details",
    "details",
    "frequency_penalty",
    "grammar",
    "top_n_tokens",
    "truncate",
    "typical_p",
    "watermark",
}


class GenerationBody(Body):
    inputs: str
    parameters: dict[str, Any] = Field(default_factory=dict)
    stream: Literal[False] | None = None


GENERATION_FIELDS = {name: f"parameters.{name}" for name in TGI_HONOURED}


def _field(loc: tuple[Any, ...], prefix: str) -> str:
    """pydantic's location as a field path (``inputs[0].context``), without its union branches' tags."""
    parts = [p for p in loc if isinstance(p, int) or (p.isidentifier() and not p[0].isupper())]
    path = prefix
    for p in parts:
        path += f"[{p}]" if isinstance(p, int) else (f".{p}" if path else p)
    return path


def parsed_body(kind: type[BaseModel], value: Any, prefix: str = "") -> Any:
    """The body (or its part under ``prefix``) as ``kind``; its first error an ``InvalidInputError`` naming
    the field (TEI's 422)."""
    try:
        return kind.model_validate(value)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = _field(tuple(err["loc"]), prefix) or (err.get("ctx") or {}).get("field") or "inputs"
        raise InvalidInputError(str(err["msg"]), field, str(err["type"])) from exc


class TaskController(Controller):
    path = "/models"
    tags = ("hugging-face",)
    exception_handlers = TEI_EXCEPTION_HANDLERS

    @post(
        ["/{model:str}", "/{model:str}/pipeline/{task:str}"],
        status_code=200,
        summary="Any task in Hugging Face's format",
        responses=TEI_ERRORS,
    )
    async def run(self, services: Services, request: HttpRequest, model: str, task: str | None = None) -> Any:
        """The model's task, Hugging Face's body and answer (``huggingface_hub.InferenceClient`` with
        ``base_url`` set to this URL)."""
        meta = request_meta(request)
        served = await services.inference.served(meta, model)
        wanted = (
            {served.task, "sentence-similarity"} if served.task == "feature-extraction" else {served.task}
        )
        if task is not None and task not in wanted:
            raise InvalidInputError(
                f"model {served.name!r} serves {served.task}, not {task}", "task", "task_mismatch"
            )
        media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if served.task == "image-classification" and not media.endswith("json"):
            return await _images(services, request, served, [await request.body()], {})
        if media != "application/json" and not media.endswith("+json"):
            raise MalformedBodyError(
                "send a JSON body (or an image's bytes to an image model)", field="Content-Type"
            )
        await read_json(request)
        body = await request.json()
        if not isinstance(body, dict):
            raise InvalidInputError("a JSON object with `inputs` is required", "inputs", "type_error")
        return await _task(services, request, served, body)


async def _task(services: Services, request: HttpRequest, served: ServedModel, body: dict[str, Any]) -> Any:
    meta = request_meta(request)
    core, name, cache = services.inference, served.ref, cache_control(request)
    if served.task == "feature-extraction":
        if isinstance(body.get("inputs"), dict):
            sim: SimilarityBody = parsed_body(SimilarityBody, body)
            pairs = [(sim.inputs.source_sentence, s) for s in sim.inputs.sentences]
            names = FieldNames(
                {QUERIES: "inputs.source_sentence", DOCUMENTS: "inputs.sentences[{i}]"},
                {QUERIES: "inputs.source_sentence", DOCUMENTS: "inputs.sentences"},
            )
            with names:
                scored = await unless_disconnected(
                    request, core.score(meta, pairs, name, cache, sim.parameters.truncation)
                )
            return [s.score for s in scored.results]
        # huggingface_hub sends an embedder's parameters beside ``inputs`` (the task's spec); the Inference
        # API's other clients under ``parameters``: either is read
        root = {k: v for k, v in body.items() if k not in ("inputs", "parameters")}
        emb: EmbeddingBody = parsed_body(EmbeddingBody, {"inputs": body.get("inputs")} if root else body)
        p = parsed_body(EmbeddingParameters, root) if root else emb.parameters
        work = core.embed(meta, emb.texts, p.normalize is not False, name, cache, p.dimensions, p.truncation)
        with emb.field_names():
            embedded = await unless_disconnected(request, work)
        return [e.vector for e in embedded.results]
    if served.task == "text-classification":
        cls: ClassificationBody = parsed_body(ClassificationBody, body)
        with cls.field_names():
            outcome = await unless_disconnected(
                request, core.classify_texts(meta, cls.texts, cls.parameters.top_k, name, cache)
            )
        return [[{"label": s.label, "score": s.score} for s in c.top] for c in outcome.results]
    if served.task == "token-classification":
        tok: TokenBody = parsed_body(TokenBody, body)
        p_tok = tok.parameters
        names = FieldNames(
            {"inputs": "inputs" if tok.single else "inputs[{i}]"},
            {"aggregation_strategy": "parameters.aggregation_strategy", "inputs": "inputs"},
        )
        with names:
            tagging = core.entities(
                meta,
                tok.texts,
                name,
                cache,
                aggregation_strategy=p_tok.aggregation_strategy,
                ignore_labels=p_tok.ignore_labels,
            )
            tagged = await unless_disconnected(request, tagging)
        group = "entity" if p_tok.aggregation_strategy == "none" else "entity_group"  # transformers' keys
        answers = [
            [
                {group: e.label, "score": e.score, "word": e.text, "start": e.start, "end": e.end}
                for e in r.entities
            ]
            for r in tagged.results
        ]
        return answers[0] if tok.single else answers
    if served.task == "question-answering":
        qa: QABody = parsed_body(QABody, body)
        single = isinstance(qa.inputs, QAInput)
        names = FieldNames(
            {
                "inputs": "inputs.question" if single else "inputs[{i}].question",
                "contexts": "inputs.context" if single else "inputs[{i}].context",
            }
        )
        with names:
            answered = await unless_disconnected(request, core.answer(meta, qa.pairs, name, cache))
        found = [
            {"answer": a.answer, "score": a.score, "start": a.start, "end": a.end} for a in answered.results
        ]
        return found[0] if single else found
    if served.task == "translation":
        tr: TranslationBody = parsed_body(TranslationBody, body)
        g = tr.parameters.generate_parameters or GenerateParameters()
        fields = FieldNames(
            {"inputs": "inputs" if tr.single else "inputs[{i}]"},
            {
                "max_new_tokens": "parameters.generate_parameters.max_new_tokens",
                "beam_size": "parameters.generate_parameters.num_beams",
            },
        )
        with fields:
            params = decoding_params(max_new_tokens=g.max_new_tokens, beam_size=g.num_beams)
            translated = await unless_disconnected(
                request, core.translate(meta, tr.texts, params, name, cache)
            )
        return [{"translation_text": t.sequences[0].text} for t in translated.results]
    if served.task == "text-generation":
        return await _generate(services, request, served, parsed_body(GenerationBody, body))
    if served.task == "image-classification":
        raw = body.get("inputs")
        if not isinstance(raw, str):
            raise InvalidInputError(
                "the image as base64 text (or send its bytes as the body)", "inputs", "type_error"
            )
        image = image_bytes("inputs", raw, core.limits.max_image_bytes)
        return await _images(services, request, served, [image], body.get("parameters") or {})
    raise InvalidInputError(
        f"model {served.name!r} serves {served.task}, which has no Hugging Face format here", "model"
    )


async def _images(
    services: Services, request: HttpRequest, served: ServedModel, images: list[bytes], parameters: Any
) -> Any:
    meta = request_meta(request)
    p: ClassificationParameters = parsed_body(ClassificationParameters, parameters)
    with FieldNames({"inputs": "inputs"}, {"inputs": "inputs"}):
        work = services.inference.classify_images(meta, images, p.top_k, served.ref, cache_control(request))
        outcome = await unless_disconnected(request, work)
    return [{"label": s.label, "score": s.score} for s in outcome.results[0].top]


async def _generate(
    services: Services, request: HttpRequest, served: ServedModel, body: GenerationBody
) -> Any:
    meta = request_meta(request)
    given = {k: v for k, v in body.parameters.items() if v is not None and v is not False}
    unknown = sorted(set(given) - TGI_KNOWN)
    if unknown:
        raise InvalidInputError(
            f"unknown parameter {unknown[0]!r}", f"parameters.{unknown[0]}", "extra_forbidden"
        )
    unused = sorted(set(given) - TGI_HONOURED - {"return_full_text"})
    if unused:
        listed = ", ".join(repr(u) for u in unused)
        raise InvalidInputError(
            f"The following `model_kwargs` are not used by the model: [{listed}]",
            f"parameters.{unused[0]}",
            "unused_model_kwargs",  # TGI's 400, which huggingface_hub reads (``tei_error``)
        )
    raw = {k: body.parameters.get(k) for k in TGI_HONOURED - {"do_sample"}}
    if isinstance(raw["stop"], list) and not raw["stop"]:
        raw["stop"] = None
    sampling = body.parameters.get("do_sample") is True or any(
        raw[k] is not None for k in ("temperature", "top_k", "top_p")
    )
    with FieldNames({}, GENERATION_FIELDS):
        params = sampling_params(**raw, greedy=not sampling)
        work = services.inference.generate(
            meta, [body.inputs], params, served.ref, cache_control(request), request_id_of(request) or ""
        )
        outcome = await unless_disconnected(request, work)
    text = outcome.results[0].text
    if body.parameters.get("return_full_text"):
        text = body.inputs + text
    return [{"generated_text": text}]
