"""The HTTP API end to end: a real uvicorn server on loopback, the tiny ONNX models, httpx. No mocks.

One server (module scope) serves the happy paths, the batched-vs-alone
parity checks, streaming, cancellation and every class of bad input; a second
one, with a queue of one, shows the 429. Nothing here asserts on timing.
"""

from __future__ import annotations

import base64
import io
import json
import random
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from parity import check_close, check_outputs_equal
from PIL import Image
from servers import LiveServer, burst_until_refused, hang_up_after_first_event, small_queues
from tokenizers import Tokenizer

from model_export.profiles import MODEL_NAMES
from service.settings import Settings

LIMITS = {"MAX_TEXT_CHARS": 4096, "MAX_CONTEXT_CHARS": 20000, "MAX_ITEMS": 32, "MAX_NEW_TOKENS": 256}
MAX_BODY_BYTES = 1024 * 1024


@pytest.fixture(scope="module")
def api(tiny_models: Path) -> Iterator[LiveServer]:
    # No response cache here: the parity tests must compute every answer they compare (the cache has its
    # own tests in test_cache.py).
    settings = Settings(
        MODEL_REPOSITORY=tiny_models, MAX_BODY_BYTES=MAX_BODY_BYTES, CACHE_ENABLED=False, **LIMITS
    )
    with LiveServer(settings) as server:
        yield server


@pytest.fixture(scope="module")
def client(api: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api.url, timeout=120) as c:
        yield c


def ok(client: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = client.post(path, json=body)
    assert r.status_code == 200, r.text
    return r.json()


def png_bytes(size: tuple[int, int] = (40, 30), mode: str = "RGB", seed: int = 0) -> bytes:
    rng = random.Random(seed)
    image = Image.new(mode, size)
    image.putdata([tuple(rng.randrange(256) for _ in mode) if len(mode) > 1 else rng.randrange(256)
                   for _ in range(size[0] * size[1])])  # fmt: skip
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def sse_events(lines: Iterator[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(event, data) pairs from an SSE line stream."""
    event, data = "message", []
    for line in lines:
        if line == "":
            if data:
                yield event, json.loads("\n".join(data))
            event, data = "message", []
        elif line.startswith("event:"):
            event = line[len("event:") :].strip()
        elif line.startswith("data:"):
            data.append(line[len("data:") :].strip())


def assert_envelope(body: dict[str, Any], model: str, n: int) -> None:
    assert body["model"] == model
    assert len(body["model_version"]) == 16
    assert body["cached"] is False
    usage = body["usage"]
    assert usage["input_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert len(body["results"]) == n


# --- service endpoints ---------------------------------------------------------------------


def test_health_models_and_openapi(client: httpx.Client) -> None:
    assert client.get("/health/live").json() == {"status": "alive"}
    ready = client.get("/health/ready")
    assert ready.status_code == 200
    assert ready.json()["status"] == "ready"

    listing = client.get("/v1/models").json()
    models = {m["name"]: m for m in listing["data"]}
    assert set(models) == set(MODEL_NAMES)
    assert listing["refused"] == []
    assert models["translator"]["default_for"] == ["translation"]
    assert models["vit"]["labels"][0] == "T-shirt/top"
    assert models["bert-qa"]["limits"]["qa_stride"] > 0
    assert all(m["execution_provider"].endswith("ExecutionProvider") for m in models.values())
    assert listing["limits"]["max_items"] == LIMITS["MAX_ITEMS"]

    schema = client.get("/schema/openapi.json").json()
    for path in ("/v1/translate", "/v1/classify", "/v1/classify/image", "/v1/generate", "/v1/extract"):
        responses = schema["paths"][path]["post"]["responses"]
        assert {"200", "400", "404", "413", "415", "422", "429", "503"} <= set(responses), path
        assert responses["422"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")
    assert {"/v1/models", "/health/live", "/health/ready"} <= set(schema["paths"])


def test_request_id_is_echoed(client: httpx.Client) -> None:
    r = client.post("/v1/classify", json={"text": ""}, headers={"X-Request-ID": "trace-42"})
    assert r.headers["x-request-id"] == "trace-42"
    assert r.json()["error"]["request_id"] == "trace-42"
    assert len(client.get("/health/live").headers["x-request-id"]) == 32
    assert len(client.get("/v1/no-such-route").headers["x-request-id"]) == 32  # router errors too


# --- translation ---------------------------------------------------------------------------

SENTENCES = [
    "A man is walking.",
    "Two young children are playing in the sand near the water.",
    "A dog runs.",
    "A woman in a red dress sings on a stage in front of a large crowd of people.",
    "People.",
]


def test_translate_single_and_scores(client: httpx.Client) -> None:
    body = ok(client, "/v1/translate", {"text": SENTENCES[0], "return_scores": True, "max_new_tokens": 12})
    assert_envelope(body, "translator", 1)
    result = body["results"][0]
    assert isinstance(result["text"], str)
    assert result["finish_reason"] in ("eos", "length")
    assert result["score"] <= 0
    assert result["sequences"] is None
    assert body["usage"]["output_tokens"] <= 12


def check_batched_as_alone(batched: list[Any], alone: list[Any], same: tuple[str, ...]) -> None:
    """Results of one batched request against each item's own request: the fields ``same`` equal, the
    scores within 1e-4."""
    check_outputs_equal(
        [tuple(r[f] for f in same) for r in batched],
        [tuple(r[f] for f in same) for r in alone],
        name_a="batched",
        name_b="one by one",
    )
    check_close(
        [r["score"] for r in batched],
        [r["score"] for r in alone],
        atol=1e-4,
        rtol=0,
        name_a="batched",
        name_b="one by one",
    )


def test_translate_batched_equals_one_by_one_greedy(client: httpx.Client) -> None:
    batched = ok(client, "/v1/translate", {"texts": SENTENCES, "return_scores": True})["results"]
    alone = [ok(client, "/v1/translate", {"text": t, "return_scores": True})["results"][0] for t in SENTENCES]
    check_batched_as_alone(batched, alone, ("text", "finish_reason"))


def test_translate_beam_search(client: httpx.Client) -> None:
    body = {"texts": SENTENCES[:3], "beam_size": 4, "num_return_sequences": 3, "return_scores": True}
    batched = ok(client, "/v1/translate", body)["results"]
    for text, got in zip(SENTENCES[:3], batched, strict=True):
        scores = [s["score"] for s in got["sequences"]]
        assert len(scores) == 3
        assert scores == sorted(scores, reverse=True)
        assert got["text"] == got["sequences"][0]["text"]
        alone = ok(client, "/v1/translate", {**body, "texts": [text]})["results"][0]
        check_outputs_equal(
            [s["text"] for s in alone["sequences"]],
            [s["text"] for s in got["sequences"]],
            name_a=f"alone: {text!r}",
            name_b="in the batch",
        )


def test_beam_1_equals_greedy(client: httpx.Client, tiny_models: Path) -> None:
    """The served greedy path (beam_size 1) against beam search with one beam, run in-process on the same files."""
    from service.engine.repository import load_model
    from service.engine.runtime import RuntimeOptions
    from service.engine.seq2seq import Seq2SeqModel
    from service.pipelines.translate import prepare_source

    model = load_model(tiny_models / "translator", RuntimeOptions(device="cpu"))
    assert model.tokenizer is not None
    seq2seq = Seq2SeqModel(model.graphs["encoder"], model.graphs["decoder"], model.manifest)
    for text in SENTENCES:
        served = ok(client, "/v1/translate", {"text": text, "beam_size": 1, "max_new_tokens": 24})["results"][
            0
        ]
        source, limit, _ = prepare_source(
            model.manifest, model.tokenizer.encode(text).ids, seq2seq.max_new_tokens, 24
        )
        (best,) = seq2seq.beam_search([source], beam_size=1, max_new_tokens=limit)[0]
        assert served["text"] == model.tokenizer.decode(best.tokens, skip_special_tokens=True)
        assert served["finish_reason"] == ("eos" if best.finished else "length")


# --- classification ------------------------------------------------------------------------

REVIEWS = [
    "a wonderful, moving film",
    "dull",
    "the plot makes no sense at all and the acting is worse",
    "fine",
]


def test_classify_text_batched_equals_one_by_one(client: httpx.Client) -> None:
    body = ok(client, "/v1/classify", {"texts": REVIEWS, "top_k": 2})
    assert_envelope(body, "bert-classifier", len(REVIEWS))
    for got in body["results"]:
        assert got["labels"][0]["label"] == got["label"]
        assert sum(x["score"] for x in got["labels"]) == pytest.approx(
            1.0, abs=1e-5
        )  # two labels: all of them
    alone = [ok(client, "/v1/classify", {"text": text, "top_k": 2})["results"][0] for text in REVIEWS]
    check_batched_as_alone(body["results"], alone, ("label",))


def test_classify_images_json_multipart_and_batch(client: httpx.Client) -> None:
    images = [png_bytes(seed=1), png_bytes((28, 28), "L", seed=2), png_bytes((300, 200), "RGBA", seed=3)]
    jpeg = io.BytesIO()
    Image.open(io.BytesIO(images[0])).convert("RGB").save(jpeg, format="JPEG")
    images.append(jpeg.getvalue())
    batched = ok(client, "/v1/classify", {"images": [b64(i) for i in images], "top_k": 3})
    assert_envelope(batched, "vit", len(images))
    alone = [ok(client, "/v1/classify", {"image": b64(data), "top_k": 3})["results"][0] for data in images]
    check_outputs_equal(
        [r["label"] for r in alone],
        [r["label"] for r in batched["results"]],
        name_a="one by one",
        name_b="batched",
    )
    check_close(
        [r["score"] for r in alone],
        [r["score"] for r in batched["results"]],
        atol=1e-4,
        rtol=0,
        name_a="one by one",
        name_b="batched",
    )
    for data, got in zip(images, batched["results"], strict=True):
        assert len(got["labels"]) == 3
        upload = client.post(
            "/v1/classify/image", files={"file": ("x.png", data, "image/png")}, data={"top_k": "3"}
        )
        assert upload.status_code == 200, upload.text
        assert upload.json()["results"][0]["label"] == got["label"]
    data_url = ok(client, "/v1/classify", {"image": "data:image/png;base64," + b64(images[0])})
    assert data_url["results"][0]["label"] == batched["results"][0]["label"]


# --- extraction ----------------------------------------------------------------------------

QA = [
    ("Where did Ada live?", "Ada Lovelace lived in London with her mother."),
    ("Who wrote the notes?", "The notes on the engine were written by Ada in 1843."),
    ("What colour is the sky?", "On a clear day the sky is blue. At night it is black."),
]


def test_extract_qa_batched_equals_one_by_one(client: httpx.Client) -> None:
    items = [{"question": q, "context": c} for q, c in QA]
    body = ok(client, "/v1/extract", {"task": "qa", "items": items})
    assert_envelope(body, "bert-qa", len(QA))
    assert body["task"] == "qa"
    alone = [
        ok(client, "/v1/extract", {"task": "qa", "question": q, "context": c})["results"][0] for q, c in QA
    ]
    check_outputs_equal(
        [(r["start"], r["end"], r["answer"]) for r in alone],
        [(r["start"], r["end"], r["answer"]) for r in body["results"]],
        name_a="one by one",
        name_b="batched",
    )
    for (_, context), got, one in zip(QA, body["results"], alone, strict=True):
        assert context[got["start"] : got["end"]] == got["answer"]
        assert 0 <= got["score"] <= 1
        assert got["windows"] == 1
        assert one["score"] == pytest.approx(got["score"], rel=1e-3, abs=1e-6)


ENTITY_TEXTS = [
    "Ada Lovelace met Charles Babbage in London.",
    "The United Nations opened an office in Geneva, Switzerland, in 1946.",
    "nothing here",
]


def test_qa_token_budget_bounds_a_requests_pairs_but_admits_any_one(tiny_models: Path) -> None:
    """MAX_CONTEXT_TOKENS sums a request's window tokens over its pairs: a second pair that passes it is
    refused, 422 naming that pair; one pair alone always passes, however many windows its context takes."""
    context = " ".join(f"Sentence {i} tells of the river and the old mill by the bridge." for i in range(30))
    pair = {"question": "What stands by the bridge?", "context": context}
    settings = Settings(MODEL_REPOSITORY=tiny_models, CACHE_ENABLED=False, MAX_CONTEXT_TOKENS=200)
    with LiveServer(settings) as server, httpx.Client(base_url=server.url, timeout=120) as c:
        alone = c.post("/v1/extract", json={"task": "qa", **pair})
        assert alone.status_code == 200, alone.text
        assert alone.json()["results"][0]["windows"] > 2 and alone.json()["usage"]["input_tokens"] > 200
        two = c.post("/v1/extract", json={"task": "qa", "items": [pair, pair]})
        assert two.status_code == 422, two.text
        error = two.json()["error"]
        assert "MAX_CONTEXT_TOKENS" in error["message"] and error["field"] == "items[1].context", error


def test_extract_entities_batched_equals_one_by_one(client: httpx.Client) -> None:
    body = ok(client, "/v1/extract", {"task": "entities", "texts": ENTITY_TEXTS})
    assert_envelope(body, "bert-tagger", len(ENTITY_TEXTS))
    for text, got in zip(ENTITY_TEXTS, body["results"], strict=True):
        for entity in got["entities"]:
            assert text[entity["start"] : entity["end"]] == entity["text"]
            assert entity["label"] in {"PER", "ORG", "LOC", "MISC"}
        alone = ok(client, "/v1/extract", {"task": "entities", "text": text})["results"][0]
        check_outputs_equal(
            [(e["start"], e["end"], e["label"]) for e in alone["entities"]],
            [(e["start"], e["end"], e["label"]) for e in got["entities"]],
            name_a=f"alone: {text!r}",
            name_b="in the batch",
        )
    long_text = " ".join(["Paris"] * 400)
    assert (
        ok(client, "/v1/extract", {"task": "entities", "text": long_text})["results"][0]["truncated"] is True
    )


# fmt: off
FILLER_WORDS = [
    "the", "of", "and", "to", "was", "for", "on", "as", "by", "with", "at", "from", "his", "an", "were",
    "which", "it", "that", "this", "be", "had", "first", "not", "or", "one", "their", "also", "new",
    "have", "its", "after", "has", "but", "two", "who", "they", "been", "time", "all", "more", "other",
    "into", "most", "only", "over", "can", "many", "world", "would", "some", "year", "war", "film", "when",
    "about", "there", "up", "people",
]
# fmt: on


def _qa_context(tokenizer: Tokenizer, room: int, stride: int, seed: int) -> tuple[str, int, int, str]:
    """Filler of one-token words, then the answer sentence, so that there are exactly two windows.

    Returns (context, char where window 1 starts, char where window 0 ends, answer sentence).
    Every filler word is one token, so cutting the context at a window edge re-tokenises
    into exactly that window's tokens.
    """
    words = [w for w in FILLER_WORDS if len(tokenizer.encode(w, add_special_tokens=False).ids) == 1]
    rng = random.Random(seed)
    answer = "The treasure is hidden in Paris."
    answer_tokens = len(tokenizer.encode(answer, add_special_tokens=False).ids)
    filler_tokens = room + (room - stride) // 2  # past window 0, and short of a third window
    filler = " ".join(rng.choice(words) for _ in range(filler_tokens - 1)) + " ."
    context = f"{filler} {answer}"
    enc = tokenizer.encode(context, add_special_tokens=False)
    assert room < len(enc.ids) <= 2 * room - stride, "the context must make exactly two windows"
    assert len(enc.ids) == filler_tokens + answer_tokens
    window1_start = enc.offsets[room - stride][0]
    window0_end = enc.offsets[room - 1][1]
    assert context.index(answer) >= window0_end, "the answer must lie only in the second window"
    return context, window1_start, window0_end, answer


def test_qa_answer_only_in_the_second_window(client: httpx.Client, tiny_models: Path) -> None:
    """Sliding-window mechanics, asserted so that a broken window path fails.

    The context is filler, then the answer sentence beyond the first window's
    reach; the windows are computed here independently from the manifest
    (room = max_len - question - 3, step = room - stride). For each of several
    fillers, the served answer over the whole context must be exactly the
    answer its reported window gives alone (the context cut to that window),
    shifted by that window's first character. A tiny model picks spans almost
    at random, so which window wins is the model's call; but across the
    fillers the second window must win at least once, and each time it does,
    its span must lie in that window (from its first character on), which
    fails if later windows are ignored or their offsets are not mapped back.
    """
    manifest = json.loads((tiny_models / "bert-qa" / "manifest.json").read_text())
    tokenizer = Tokenizer.from_file(str(tiny_models / "bert-qa" / "tokenizer.json"))
    question = "Where is the treasure hidden?"
    q_tokens = len(tokenizer.encode(question, add_special_tokens=False).ids)
    max_len, stride = manifest["max_sequence_length"], manifest["qa"]["stride"]
    room = max_len - min(q_tokens, manifest["qa"]["max_question_length"]) - 3

    second_window_wins = 0
    for seed in range(12):
        context, w1_start, w0_end, _ = _qa_context(tokenizer, room, stride, seed)
        full = ok(client, "/v1/extract", {"task": "qa", "question": question, "context": context})["results"][
            0
        ]
        assert full["windows"] == 2
        assert full["window"] in (0, 1)
        offset = 0 if full["window"] == 0 else w1_start
        piece = context[:w0_end] if full["window"] == 0 else context[w1_start:]
        alone = ok(client, "/v1/extract", {"task": "qa", "question": question, "context": piece})["results"][
            0
        ]
        assert alone["windows"] == 1
        assert (full["start"], full["end"]) == (alone["start"] + offset, alone["end"] + offset)
        assert full["score"] == pytest.approx(alone["score"], rel=1e-3, abs=1e-6)
        assert context[full["start"] : full["end"]] == full["answer"]
        if full["window"] == 1:
            second_window_wins += 1
            assert full["start"] >= w1_start
    assert second_window_wins > 0, "the second window never won: is it ignored?"


# --- generation ----------------------------------------------------------------------------

PROMPTS = ["ROMEO:", "First Citizen:\nBefore we proceed", "O", "KING HENRY:\nNow is the winter", "What", "Be it so",
           "JULIET:\nWherefore art thou", "Hark"]  # fmt: skip


def test_generate_single_and_batch(client: httpx.Client) -> None:
    body = ok(client, "/v1/generate", {"prompt": "ROMEO:", "max_new_tokens": 8, "temperature": 0})
    assert_envelope(body, "gpt", 1)
    result = body["results"][0]
    assert result["finish_reason"] in ("length", "eos", "stop")
    assert 1 <= result["completion_tokens"] <= 8
    assert body["usage"]["output_tokens"] == result["completion_tokens"]
    batch = ok(client, "/v1/generate", {"prompts": PROMPTS[:3], "max_new_tokens": 6, "temperature": 0})
    assert_envelope(batch, "gpt", 3)
    alone = ok(client, "/v1/generate", {"prompt": "ROMEO:", "max_new_tokens": 6, "temperature": 0})[
        "results"
    ][0]
    check_outputs_equal([batch["results"][0]["text"]], [alone["text"]], name_a="batch item 0", name_b="alone")


def test_generate_stop_string(client: httpx.Client) -> None:
    free = ok(client, "/v1/generate", {"prompt": "ROMEO:", "max_new_tokens": 20, "temperature": 0})[
        "results"
    ][0]
    if len(free["text"]) < 4:
        pytest.skip("the tiny model stopped too early to pick a stop string")
    stop = free["text"][2:4]
    cut = ok(
        client, "/v1/generate", {"prompt": "ROMEO:", "max_new_tokens": 20, "temperature": 0, "stop": [stop]}
    )
    result = cut["results"][0]
    assert result["finish_reason"] == "stop"
    assert stop not in result["text"]
    assert free["text"].startswith(result["text"])


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 0.9, "top_k": 40, "top_p": 0.95}])
def test_concurrent_generations_equal_alone(client: httpx.Client, sampling: dict[str, Any]) -> None:
    """8 prompts of different lengths and budgets, all at once, each get the tokens they get alone."""
    bodies = [
        {"prompt": p, "max_new_tokens": 5 + 4 * i, "seed": 1000 + i, **sampling}
        for i, p in enumerate(PROMPTS)
    ]
    alone = [ok(client, "/v1/generate", b)["results"][0] for b in bodies]
    with ThreadPoolExecutor(len(bodies)) as pool:
        together = list(pool.map(lambda b: ok(client, "/v1/generate", b)["results"][0], bodies))
    check_outputs_equal(
        [(r["text"], r["completion_tokens"]) for r in together],
        [(r["text"], r["completion_tokens"]) for r in alone],
        name_a="concurrent",
        name_b="alone",
    )


def test_stream_concatenates_to_the_non_streamed_text(client: httpx.Client) -> None:
    body = {"prompt": "KING HENRY:\nNow is", "max_new_tokens": 24, "temperature": 0}
    plain = ok(client, "/v1/generate", body)["results"][0]
    with client.stream("POST", "/v1/generate", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = list(sse_events(r.iter_lines()))
    tokens = [data for event, data in events if event == "token"]
    assert [t["index"] for t in tokens] == list(range(len(tokens)))
    assert "".join(t["text"] for t in tokens) == plain["text"]
    (done_event, done) = events[-1]
    assert done_event == "done"
    assert done["text"] == plain["text"]
    assert done["finish_reason"] == plain["finish_reason"]
    assert done["usage"]["output_tokens"] == len(tokens) == plain["completion_tokens"]


def test_disconnect_mid_stream_cancels_the_sequence(api: LiveServer) -> None:
    """Close the connection after the first token; the engine's own counter must record the cancel.

    The tiny model decodes fast, so a sequence may finish before the server
    notices the disconnect; other sequences keep the batch busy, and the test
    tries a few times. It fails only if no disconnect ever cancels anything.
    """
    engine = api.pipeline("gpt").engine
    before = engine.cancelled_sequences
    max_context = engine.max_context
    load = {"prompt": "O", "max_new_tokens": max_context - 4, "temperature": 0.8, "seed": 1}
    with httpx.Client(base_url=api.url, timeout=120) as other, ThreadPoolExecutor(6) as pool:
        for _attempt in range(5):
            busy = [pool.submit(other.post, "/v1/generate", json=load) for _ in range(6)]
            body = {"prompt": "ROMEO:", "max_new_tokens": max_context - 8, "temperature": 0, "stream": True}
            hang_up_after_first_event(api.url, "/v1/generate", body)
            deadline = time.monotonic() + 10
            while engine.cancelled_sequences == before and time.monotonic() < deadline:
                time.sleep(0.02)
            for f in busy:
                assert f.result().status_code == 200
            if engine.cancelled_sequences > before:
                break
    assert engine.cancelled_sequences > before
    assert client_ready(api)


def client_ready(api: LiveServer) -> bool:
    return httpx.get(f"{api.url}/health/ready", timeout=30).status_code == 200


# --- bad input -------------------------------------------------------------------------------

_GARBAGE_IMAGE = b64(b"this is not an image at all")

BAD_JSON: list[tuple[str, str, Any, int, str | None]] = [
    # (case, path, body, status, field)
    ("empty text", "/v1/translate", {"text": ""}, 422, "text"),
    ("whitespace text", "/v1/classify", {"text": "  \n\t "}, 422, "text"),
    ("whitespace in a batch", "/v1/classify", {"texts": ["good", " "]}, 422, "texts[1]"),
    ("oversized text", "/v1/translate", {"text": "a" * 4097}, 422, "text"),
    ("oversized prompt", "/v1/generate", {"prompt": "a" * 4097}, 422, "prompt"),
    ("prompt over the context", "/v1/generate", {"prompt": "to be or not " * 300}, 422, "prompt"),
    (
        "oversized context",
        "/v1/extract",
        {"task": "qa", "question": "q?", "context": "c" * 20001},
        422,
        "context",
    ),
    (
        "empty QA context",
        "/v1/extract",
        {"task": "qa", "items": [{"question": "q", "context": " "}]},
        422,
        "items[0].context",
    ),
    ("too many items", "/v1/classify", {"texts": ["a"] * 33}, 422, "texts"),
    ("too many prompts", "/v1/generate", {"prompts": ["a"] * 33}, 422, "prompts"),
    ("empty batch", "/v1/translate", {"texts": []}, 422, "texts"),
    ("no input", "/v1/translate", {}, 422, "text"),
    ("two inputs", "/v1/classify", {"text": "a", "image": _GARBAGE_IMAGE}, 422, "text"),
    ("unknown model", "/v1/translate", {"text": "hi", "model": "nope"}, 404, "model"),
    ("unknown field", "/v1/translate", {"text": "hi", "beam_siz": 2}, 422, "beam_siz"),
    ("beam_size 9", "/v1/translate", {"text": "hi", "beam_size": 9}, 422, "beam_size"),
    (
        "returns > beams",
        "/v1/translate",
        {"text": "hi", "beam_size": 2, "num_return_sequences": 3},
        422,
        "num_return_sequences",
    ),
    ("max_new_tokens over", "/v1/translate", {"text": "hi", "max_new_tokens": 257}, 422, "max_new_tokens"),
    (
        "max_new_tokens 10**400",
        "/v1/generate",
        {"prompt": "hi", "max_new_tokens": 10**400},
        422,
        "max_new_tokens",
    ),
    ("temperature -1", "/v1/generate", {"prompt": "hi", "temperature": -1}, 422, "temperature"),
    ("top_p 0", "/v1/generate", {"prompt": "hi", "top_p": 0}, 422, "top_p"),
    ("top_k -1", "/v1/classify", {"text": "hi", "top_k": 0}, 422, "top_k"),
    ("stream a batch", "/v1/generate", {"prompts": ["a", "b"], "stream": True}, 422, "stream"),
    ("bad task", "/v1/extract", {"task": "ner", "text": "x"}, 422, "task"),
    ("field of the other task", "/v1/extract", {"task": "qa", "text": "x"}, 422, "text"),
    ("undecodable base64", "/v1/classify", {"image": "%%% not base64 %%%"}, 422, "image"),
    ("not an image", "/v1/classify", {"images": [b64(png_bytes()), _GARBAGE_IMAGE]}, 422, "images[1]"),
    (
        "text model for an image",
        "/v1/classify",
        {"image": b64(png_bytes()), "model": "bert-classifier"},
        422,
        "model",
    ),
    ("image model for text", "/v1/classify", {"text": "hi", "model": "vit"}, 422, "model"),
    (
        "qa model for entities",
        "/v1/extract",
        {"task": "entities", "text": "hi", "model": "bert-qa"},
        422,
        "model",
    ),
    ("not an object", "/v1/translate", [1, 2], 422, None),
]


@pytest.mark.parametrize(("case", "path", "body", "status", "field"), BAD_JSON, ids=[c[0] for c in BAD_JSON])
def test_bad_json_input_names_the_field(
    client: httpx.Client, case: str, path: str, body: Any, status: int, field: str | None
) -> None:
    r = client.post(path, json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error.get("field") == field, error
    assert error["message"]
    assert error["request_id"] == r.headers["x-request-id"]


def test_bad_transport_input(client: httpx.Client) -> None:
    wrong_type = client.post("/v1/translate", content=b"text=hello", headers={"content-type": "text/plain"})
    assert wrong_type.status_code == 415
    assert wrong_type.json()["error"]["field"] == "Content-Type"

    malformed = client.post(
        "/v1/translate", content=b'{"text": "hi"', headers={"content-type": "application/json"}
    )
    assert malformed.status_code == 400
    assert malformed.json()["error"]["type"] == "malformed_json"

    huge = b'{"text": "' + b"a" * MAX_BODY_BYTES + b'"}'
    too_large = client.post("/v1/translate", content=huge, headers={"content-type": "application/json"})
    assert too_large.status_code == 413
    assert too_large.json()["error"]["type"] == "payload_too_large"

    json_to_upload = client.post("/v1/classify/image", json={"image": b64(png_bytes())})
    assert json_to_upload.status_code == 415

    garbage_file = client.post("/v1/classify/image", files={"file": ("x.png", b"garbage", "image/png")})
    assert garbage_file.status_code == 422
    assert garbage_file.json()["error"]["field"] == "file"

    no_file = client.post("/v1/classify/image", files={"other": ("x.png", png_bytes(), "image/png")})
    assert no_file.status_code == 422
    assert no_file.json()["error"]["field"] == "file"

    bad_top_k = client.post(
        "/v1/classify/image", files={"file": ("x.png", png_bytes(), "image/png")}, data={"top_k": "0"}
    )
    assert bad_top_k.status_code == 422
    assert bad_top_k.json()["error"]["field"] == "top_k"

    assert client.get("/v1/nothing-here").status_code == 404
    assert client.get("/health/ready").status_code == 200  # none of it hurt the service


# --- backpressure ----------------------------------------------------------------------------


def test_full_queue_answers_429_with_retry_after(tiny_models: Path) -> None:
    """A queue of one, batches of one, and a burst of concurrent translations: the overflow gets 429."""
    body = {"text": SENTENCES[3], "beam_size": 4, "max_new_tokens": 60}
    with LiveServer(small_queues(tiny_models)) as server, httpx.Client(base_url=server.url, timeout=120) as c:
        for r in burst_until_refused(c, "/v1/translate", body):
            assert r.json()["error"]["type"] == "queue_full"
        assert c.get("/health/ready").status_code == 200
