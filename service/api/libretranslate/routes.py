"""LibreTranslate's routes: ``POST /translate``, ``GET /languages``, ``POST /detect``, ``GET /frontend/settings``.

Bodies are read as LibreTranslate reads them: JSON (``application/json``) or a form (urlencoded, as
``libretranslatepy`` sends it, or multipart), ``q`` a string or (JSON) a list of strings. Each pair is a
served translation model's manifest (``source_language`` -> ``target_language``); ``source: "auto"`` is its
one source language, since no language detector runs here. A translation is ``InferenceService.translate``,
the one ``POST /v1/translate`` calls: the same documents (sentences split, HTML's text nodes), batcher,
limits, quotas, metrics and response cache. ``api_key`` in a body is the key the key check reads
(``api/http/body_key.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from litestar import Controller, get, post
from litestar.exceptions import SerializationException

from service.api.http.caching import cache_control
from service.api.http.deps import HttpRequest, Services
from service.api.http.disconnect import unless_disconnected
from service.api.http.fields import one_or_many
from service.api.http.meta import request_meta
from service.api.libretranslate.errors import LIBRETRANSLATE_ERRORS, LIBRETRANSLATE_EXCEPTION_HANDLERS
from service.errors import InvalidInputError
from service.inference import DecodingParams, InferenceService, TextFormat, Translation
from service.metadata import RequestMeta

# LibreTranslate's default alternatives limit is unbounded; here alternatives + 1 hypotheses are one beam.
MAX_ALTERNATIVES = 7
# ISO 639-1 names for the languages a translation manifest may name (others are shown by their code).
NAMES = {
    "ar": "Arabic", "cs": "Czech", "da": "Danish", "de": "German", "el": "Greek", "en": "English",
    "es": "Spanish", "fi": "Finnish", "fr": "French", "hi": "Hindi", "hu": "Hungarian", "it": "Italian",
    "ja": "Japanese", "ko": "Korean", "nl": "Dutch", "pl": "Polish", "pt": "Portuguese", "ro": "Romanian",
    "ru": "Russian", "sv": "Swedish", "tr": "Turkish", "uk": "Ukrainian", "zh": "Chinese",
}  # fmt: skip


def refused(message: str) -> InvalidInputError:
    """A request LibreTranslate answers 400, in its words (no field: the message says it)."""
    return InvalidInputError(message, None, "invalid_request")


@dataclass(frozen=True)
class Pairs:
    """The served pairs: (source, target) -> the translation model that serves it."""

    models: dict[tuple[str, str], str]

    @classmethod
    def of(cls, inference: InferenceService, meta: RequestMeta) -> Pairs:
        """The pairs of the models ``meta``'s caller may know of."""
        models: dict[tuple[str, str], str] = {}
        for served in inference.models(meta):
            extra = served.manifest.model_extra or {}
            source, target = extra.get("source_language"), extra.get("target_language")
            if not (served.task == "translation" and isinstance(source, str) and isinstance(target, str)):
                continue
            if (source, target) not in models or "translation" in served.default_for:  # the default wins
                models[(source, target)] = served.name
        return cls(models)

    @property
    def languages(self) -> list[str]:
        return sorted({code for pair in self.models for code in pair})

    def targets(self, source: str) -> list[str]:
        return sorted(t for s, t in self.models if s == source)

    @property
    def sources(self) -> list[str]:
        return sorted({s for s, _ in self.models})

    def model(self, source: str, target: str) -> str:
        """The model for the pair, or LibreTranslate's 400 for a language or a pair not served."""
        if source not in self.languages:
            raise refused(f"{source} is not supported")
        if target not in self.languages:
            raise refused(f"{target} is not supported")
        model = self.models.get((source, target))
        if model is None:
            raise refused(
                f"{name(target)} ({target}) is not available as a target language from {name(source)} ({source})"
            )
        return model

    def auto(self, target: str) -> str:
        """``source: "auto"``: no detector runs, so the source is the one a model serves into ``target``."""
        sources = sorted(s for s, t in self.models if t == target) or self.sources
        return sources[0] if sources else "en"


def name(code: str) -> str:
    return NAMES.get(code, code)


def is_json(request: HttpRequest) -> bool:
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


async def values(request: HttpRequest) -> dict[str, Any]:
    """The body's parameters, JSON or form, as LibreTranslate reads them."""
    if is_json(request):
        try:
            body = await request.json()
        except (SerializationException, UnicodeDecodeError, RecursionError) as exc:
            raise refused("Invalid JSON format") from exc
        if not isinstance(body, dict):
            raise refused("Invalid JSON format")
        return body
    form = await request.form()
    return {k: form.get(k) for k in form}


def _text(value: Any, name: str) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise refused(f"Invalid request: {name} parameter must be a string")
    return value


def _alternatives(value: Any) -> int:
    try:
        count = max(0, int(value or 0))
    except (TypeError, ValueError) as exc:
        raise refused("Invalid request: alternatives parameter is not a number") from exc
    if count > MAX_ALTERNATIVES:
        raise refused(f"Invalid request: alternatives parameter must be <= {MAX_ALTERNATIVES}")
    return count


def _unique(texts: list[str], best: str) -> list[str]:
    """LibreTranslate's ``filter_unique``: each alternative once, never the translation itself."""
    seen, out = {best}, []
    for t in texts:
        if t not in seen:
            seen.add(t)
            out.append(t)
    return out


class LibreTranslateController(Controller):
    path = "/"
    tags = ("libretranslate",)
    exception_handlers = LIBRETRANSLATE_EXCEPTION_HANDLERS

    @post(
        "/translate",
        status_code=200,
        summary="LibreTranslate: translate text",
        responses=LIBRETRANSLATE_ERRORS,
    )
    async def translate(self, services: Services, request: HttpRequest) -> dict[str, Any]:
        """LibreTranslate's ``{q, source, target, format, alternatives, api_key}`` (JSON or a form) ->
        ``{translatedText, alternatives?, detectedLanguage?}``; ``q`` a list answers lists. Greedy search,
        or a beam of ``alternatives + 1`` when alternatives are asked for."""
        given = await values(request)
        q = given.get("q")
        batch = isinstance(q, list)
        if not q:
            raise refused("Invalid request: missing q parameter")
        texts = [_text(t, "q") or "" for t in q] if batch else [_text(q, "q") or ""]
        source, target = _text(given.get("source"), "source"), _text(given.get("target"), "target")
        if source is None:
            raise refused("Invalid request: missing source parameter")
        if target is None:
            raise refused("Invalid request: missing target parameter")
        alternatives = _alternatives(given.get("alternatives"))
        if not batch and not is_json(request):
            texts = ["\n".join(texts[0].splitlines())]  # as LibreTranslate: a form's line ends as LF
        inference, meta = services.inference, request_meta(request)
        pairs = Pairs.of(inference, meta)
        detected = source == "auto"
        if detected:
            source = pairs.auto(target)
        model = pairs.model(source, target)
        text_format: TextFormat
        match _text(given.get("format"), "format") or "text":
            case "text":
                text_format = "text"
            case "html":
                text_format = "html"
            case other:
                raise refused(f"{other} format is not supported")
        # What has nothing to translate comes back as it was (LibreTranslate's ``detect_translatable``).
        todo = [i for i, t in enumerate(texts) if t.strip()]
        results: dict[int, Translation] = {}
        if todo:
            beams = alternatives + 1
            params = DecodingParams(beam_size=beams, num_return_sequences=beams)
            work = inference.translate(
                meta, [texts[i] for i in todo], params, model, cache_control(request), None, text_format
            )
            with one_or_many("q", "q", not batch):
                outcome = await unless_disconnected(request, work)
            results = dict(zip(todo, outcome.results, strict=True))
        translated = [results[i].sequences[0].text if i in results else t for i, t in enumerate(texts)]
        others = [
            _unique([s.text for s in results[i].sequences[1:]], translated[i]) if i in results else []
            for i in range(len(texts))
        ]
        language = {"confidence": 0.0, "language": source}  # assumed, not detected
        body: dict[str, Any] = {"translatedText": translated if batch else translated[0]}
        if detected:
            body["detectedLanguage"] = [language] * len(texts) if batch else language
        if alternatives > 0:
            body["alternatives"] = others if batch else others[0]
        return body

    @get("/languages", summary="LibreTranslate: the served languages", responses=LIBRETRANSLATE_ERRORS)
    async def languages(self, services: Services, request: HttpRequest) -> list[dict[str, Any]]:
        """``[{code, name, targets}]``: every language of a served pair, with the targets it translates to."""
        pairs = Pairs.of(services.inference, request_meta(request))
        return [{"code": c, "name": name(c), "targets": pairs.targets(c)} for c in pairs.languages]

    @post(
        "/detect",
        status_code=200,
        summary="LibreTranslate: the source language",
        responses=LIBRETRANSLATE_ERRORS,
    )
    async def detect(self, services: Services, request: HttpRequest) -> list[dict[str, Any]]:
        """No detector runs here: the answer is the source language the served models read, with
        confidence 0 (not measured). With models of several source languages, each is listed."""
        q = (await values(request)).get("q")
        if not q:
            raise refused("Invalid request: missing q parameter")
        return [
            {"confidence": 0.0, "language": s}
            for s in Pairs.of(services.inference, request_meta(request)).sources or ["en"]
        ]

    @get(
        "/frontend/settings",
        summary="LibreTranslate: settings for its web front end",
        responses=LIBRETRANSLATE_ERRORS,
    )
    async def frontend_settings(self, services: Services, request: HttpRequest) -> dict[str, Any]:
        pairs = Pairs.of(services.inference, request_meta(request))
        source = pairs.sources[0] if pairs.sources else "en"
        targets = pairs.targets(source)
        target = targets[0] if targets else source
        settings = services.settings
        keyed = bool(settings.api_keys or settings.api_keys_file)
        return {
            "charLimit": services.inference.limits.max_text_chars,
            "frontendTimeout": 500,
            "apiKeys": keyed,
            "keyRequired": keyed,
            "suggestions": False,
            "filesTranslation": False,
            "supportedFilesFormat": [],
            "language": {
                "source": {"code": source, "name": name(source)},
                "target": {"code": target, "name": name(target)},
            },
        }
