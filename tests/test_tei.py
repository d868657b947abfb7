"""TEI's routes and Hugging Face's task format, driven by the clients their users have, unchanged:
``huggingface_hub.InferenceClient(base_url=...)`` on every served task and LlamaIndex's
``TextEmbeddingsInference``; each compared with the REST door's answer for the same input. One live
server (behind an API key, which the clients send as their token) for the module.
"""

from __future__ import annotations

import base64
import io
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest
from huggingface_hub import InferenceClient
from huggingface_hub.errors import HfHubHTTPError
from llama_index.embeddings.text_embeddings_inference import TextEmbeddingsInference
from PIL import Image
from servers import LiveServer
from tokenizers import Tokenizer

from service.pipelines.classify import pair_positions
from service.pipelines.text_inputs import Truncation
from service.settings import Settings

KEY = "tei-key"
TEXTS = ["A man is playing a guitar.", "The central bank raised interest rates again this quarter."]
LONG = "Guitars were first made in Spain. " + "The weather report said rain again tomorrow. " * 12


@pytest.fixture(scope="module")
def api(tiny_models: Path) -> Iterator[LiveServer]:
    template = Path(__file__).parent / "data" / "chat_template.jinja"  # the tiny GPT has none of its own
    settings = Settings(
        MODEL_REPOSITORY=tiny_models,
        MAX_ITEMS=8,
        MAX_QUEUE_DELAY_MS=20,
        API_KEYS=[KEY],
        CHAT_TEMPLATE=template,
    )
    with LiveServer(settings) as server:
        yield server


@pytest.fixture(scope="module")
def http(api: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api.url, timeout=120, headers={"Authorization": f"Bearer {KEY}"}) as c:
        yield c


def hf(api: LiveServer, model: str) -> InferenceClient:
    return InferenceClient(base_url=f"{api.url}/models/{model}", api_key=KEY)


def rest(http: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    answer = http.post(path, json={"cache": False, **body})
    assert answer.status_code == 200, answer.text
    out: dict[str, Any] = answer.json()
    return out


def rest_vectors(http: httpx.Client, texts: list[str]) -> np.ndarray:
    return np.array([r["embedding"] for r in rest(http, "/v1/embed", {"texts": texts})["results"]])


def png_bytes(seed: int = 0) -> bytes:
    rng = random.Random(seed)
    image = Image.new("RGB", (40, 30))
    image.putdata([tuple(rng.randrange(256) for _ in "RGB") for _ in range(40 * 30)])
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


# --------------------------------------------------------------------------- Hugging Face's clients


def test_inference_client_feature_extraction_and_similarity(api: LiveServer, http: httpx.Client) -> None:
    client = hf(api, "bert-embedder")
    expected = rest_vectors(http, TEXTS)
    got = client.feature_extraction(TEXTS[0])
    assert got.shape == (1, expected.shape[1])
    np.testing.assert_allclose(got[0], expected[0], atol=1e-5)
    raw = client.feature_extraction(TEXTS[1], normalize=False)
    pooled = rest(http, "/v1/embed", {"text": TEXTS[1], "normalize": False})["results"][0]["embedding"]
    np.testing.assert_allclose(raw[0], pooled, atol=1e-5)
    similarity = client.sentence_similarity(TEXTS[0], other_sentences=TEXTS)
    assert similarity == pytest.approx(list(expected @ expected[0]), abs=1e-5)


def test_inference_client_text_classification(api: LiveServer, http: httpx.Client) -> None:
    expected = rest(http, "/v1/classify", {"text": TEXTS[0], "top_k": 2})["results"][0]["labels"]
    got = hf(api, "bert-classifier").text_classification(TEXTS[0])
    assert [g.label for g in got] == [e["label"] for e in expected]
    assert [g.score for g in got] == pytest.approx([e["score"] for e in expected], abs=1e-6)
    top = hf(api, "bert-classifier").text_classification(TEXTS[0], top_k=1)
    assert len(top) == 1 and top[0].label == expected[0]["label"]


def test_inference_client_token_classification(api: LiveServer, http: httpx.Client) -> None:
    text = "Ada Lovelace met Charles Babbage in London."
    expected = rest(http, "/v1/extract", {"task": "entities", "text": text})["results"][0]["entities"]
    got = hf(api, "bert-tagger").token_classification(text)
    assert [(g.entity_group, g.start, g.end, g.word) for g in got] == [
        (e["label"], e["start"], e["end"], e["text"]) for e in expected
    ]
    assert [g.score for g in got] == pytest.approx([e["score"] for e in expected], abs=1e-6)
    labels = {e["label"] for e in expected}
    if labels:
        dropped = hf(api, "bert-tagger").token_classification(text, ignore_labels=sorted(labels))
        assert dropped == []


def test_inference_client_question_answering(api: LiveServer, http: httpx.Client) -> None:
    question, context = "Who wrote the notes?", "The notes on the engine were written by Ada in 1843."
    expected = rest(http, "/v1/extract", {"task": "qa", "question": question, "context": context})["results"][
        0
    ]
    got = hf(api, "bert-qa").question_answering(question=question, context=context)
    assert (got.answer, got.start, got.end) == (expected["answer"], expected["start"], expected["end"])
    assert got.score == pytest.approx(expected["score"], abs=1e-6)


def test_inference_client_translation(api: LiveServer, http: httpx.Client) -> None:
    text = "The cat sat on the mat."
    expected = rest(http, "/v1/translate", {"text": text, "max_new_tokens": 12})["results"][0]["text"]
    got = hf(api, "translator").translation(text, generate_parameters={"max_new_tokens": 12})
    assert got.translation_text == expected


def test_inference_client_text_generation(api: LiveServer, http: httpx.Client) -> None:
    prompt = "KING:"
    expected = rest(http, "/v1/generate", {"prompt": prompt, "max_new_tokens": 8, "temperature": 0})
    client = hf(api, "gpt")
    assert client.text_generation(prompt, max_new_tokens=8) == expected["results"][0]["text"]
    # a TGI parameter this service does not honour: TGI's 400, which the client reads, drops it and retries
    with pytest.warns(UserWarning, match="watermark"):
        again = client.text_generation(prompt, max_new_tokens=8, watermark=True)
    assert again == expected["results"][0]["text"]


def test_inference_client_image_classification(api: LiveServer, http: httpx.Client) -> None:
    image = png_bytes(seed=3)
    expected = rest(http, "/v1/classify", {"image": base64.b64encode(image).decode(), "top_k": 10})[
        "results"
    ][0]["labels"]
    got = hf(api, "vit").image_classification(image)  # the raw bytes as the body
    assert [g.label for g in got] == [e["label"] for e in expected]
    assert [g.score for g in got] == pytest.approx([e["score"] for e in expected], abs=1e-6)
    top = hf(api, "vit").image_classification(image, top_k=2)  # base64 in JSON, with parameters
    assert [g.label for g in top] == [e["label"] for e in expected[:2]]


def test_inference_client_sees_errors_as_http_errors(api: LiveServer) -> None:
    with pytest.raises(HfHubHTTPError) as refused:
        hf(api, "bert-classifier").text_classification(TEXTS[0], top_k=0)
    assert refused.value.response.status_code == 422
    assert refused.value.response.json()["error"].startswith("parameters.top_k:")
    with pytest.raises(HfHubHTTPError) as unknown:
        hf(api, "no-such-model").text_classification(TEXTS[0])
    assert unknown.value.response.status_code == 404


def test_llama_index_tei_embeddings(api: LiveServer, http: httpx.Client) -> None:
    embedder = TextEmbeddingsInference(
        model_name="bert-embedder", base_url=api.url, auth_token=KEY, timeout=60
    )
    got = embedder.get_text_embedding_batch(TEXTS)
    np.testing.assert_allclose(np.array(got), rest_vectors(http, TEXTS), atol=1e-5)
    np.testing.assert_allclose(
        embedder.get_query_embedding(TEXTS[0]), rest_vectors(http, TEXTS[:1])[0], atol=1e-5
    )


# --------------------------------------------------------------------------- TEI's own routes


def test_tei_embed_and_its_truncation(http: httpx.Client) -> None:
    answer = http.post("/embed", json={"inputs": TEXTS[0]})
    assert answer.status_code == 200, answer.text
    np.testing.assert_allclose(np.array(answer.json()), rest_vectors(http, TEXTS[:1]), atol=1e-5)
    batch = http.post("/embed", json={"inputs": TEXTS, "normalize": True}).json()
    np.testing.assert_allclose(np.array(batch), rest_vectors(http, TEXTS), atol=1e-5)

    refused = http.post("/embed", json={"inputs": ["short", LONG], "truncate": False})
    assert refused.status_code == 422
    assert refused.json() == {"error": refused.json()["error"], "error_type": "Validation"}
    assert refused.json()["error"].startswith("inputs[1]:")
    right = np.array(http.post("/embed", json={"inputs": LONG, "truncate": True}).json()[0])
    left = np.array(http.post("/embed", json={"inputs": LONG, "truncation_direction": "Left"}).json()[0])
    np.testing.assert_allclose(right, rest_vectors(http, [LONG])[0], atol=1e-5)  # the default cut
    assert float(right @ left) < 0.9999  # the other end of the text was kept


def test_tei_predict(http: httpx.Client) -> None:
    expected = [rest(http, "/v1/classify", {"text": t, "top_k": 2})["results"][0]["labels"] for t in TEXTS]
    one = http.post("/predict", json={"inputs": TEXTS[0]}).json()
    assert [p["label"] for p in one] == [e["label"] for e in expected[0]]
    assert [p["score"] for p in one] == pytest.approx([e["score"] for e in expected[0]], abs=1e-6)
    batch = http.post("/predict", json={"inputs": [[TEXTS[0]], [TEXTS[1]]]}).json()
    assert [[p["label"] for p in row] for row in batch] == [[e["label"] for e in row] for row in expected]


def test_tei_predict_sentence_pairs(http: httpx.Client, tiny_models: Path) -> None:
    """TEI reads two strings as one sentence pair: ``[CLS] a [SEP] b [SEP]`` with its segment ids, checked
    against the classifier's own ONNX file run here on the tokenizer's pair encoding."""
    folder = tiny_models / "bert-classifier"
    encoding = Tokenizer.from_file(str(folder / "tokenizer.json")).encode(TEXTS[0], "a guitar")
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    feeds = {
        "input_ids": np.array([encoding.ids]),
        "attention_mask": np.ones((1, len(encoding.ids)), dtype=np.int64),
        "token_type_ids": np.array([encoding.type_ids]),
    }
    logits = session.run(None, feeds)[0][0].astype(np.float64)
    expected = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    labels = http.get("/info", params={"model": "bert-classifier"}).json()["model_type"]["classifier"][
        "id2label"
    ]

    one = http.post("/predict", json={"inputs": [TEXTS[0], "a guitar"], "model": "bert-classifier"})
    assert one.status_code == 200, one.text
    got = {p["label"]: p["score"] for p in one.json()}
    assert got == pytest.approx({labels[str(i)]: float(p) for i, p in enumerate(expected)}, abs=1e-4)
    mixed = http.post("/predict", json={"inputs": [[TEXTS[0], "a guitar"], [TEXTS[1]]]}).json()
    assert {p["label"]: p["score"] for p in mixed[0]} == pytest.approx(got, abs=1e-6)
    single = http.post("/predict", json={"inputs": TEXTS[1]}).json()
    assert {p["label"]: p["score"] for p in mixed[1]} == pytest.approx(
        {p["label"]: p["score"] for p in single}, abs=1e-6
    )

    long_pair = http.post("/predict", json={"inputs": [LONG, "a guitar"], "truncate": False})
    assert long_pair.status_code == 422 and long_pair.json()["error"].startswith("inputs:")
    cut = http.post("/predict", json={"inputs": [LONG, "a guitar"]})
    assert cut.status_code == 200
    three = http.post("/predict", json={"inputs": [["a", "b", "c"]]})
    assert three.status_code == 422 and three.json()["error"].startswith("inputs[0]:")


def test_inference_api_pipeline_path(http: httpx.Client) -> None:
    """The Inference API's embedder path, ``/models/{model}/pipeline/{task}``, answers as the bare one."""
    bare = http.post("/models/bert-embedder", json={"inputs": TEXTS}).json()
    piped = http.post("/models/bert-embedder/pipeline/feature-extraction", json={"inputs": TEXTS})
    assert piped.status_code == 200
    np.testing.assert_allclose(np.array(piped.json()), np.array(bare), atol=1e-6)
    wrong = http.post("/models/bert-embedder/pipeline/text-classification", json={"inputs": "a"})
    assert wrong.status_code == 422 and wrong.json()["error"].startswith("task:")


def test_tei_similarity(http: httpx.Client) -> None:
    vectors = rest_vectors(http, [TEXTS[0], *TEXTS])
    body = {"inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS}}
    answer = http.post("/similarity", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json() == pytest.approx(list(vectors[1:] @ vectors[0]), abs=1e-5)


def test_tei_tokenize_decode_and_info(http: httpx.Client, tiny_models: Path) -> None:
    tokenizer = Tokenizer.from_file(str(tiny_models / "bert-embedder" / "tokenizer.json"))
    text = "Guitars, naturally."
    rows = http.post("/tokenize", json={"inputs": [text]}).json()
    tokens = rows[0]
    assert [t["id"] for t in tokens] == tokenizer.encode(text).ids
    assert tokens[0]["special"] and tokens[0]["start"] is None and tokens[-1]["special"]
    for t in tokens[1:-1]:
        assert not t["special"] and text[t["start"] : t["stop"]] == t["text"]
    bare = http.post("/tokenize", json={"inputs": text, "add_special_tokens": False}).json()[0]
    assert [t["id"] for t in bare] == [t["id"] for t in tokens[1:-1]]

    ids = [t["id"] for t in tokens]
    assert http.post("/decode", json={"ids": ids}).json() == [tokenizer.decode(ids)]
    kept = http.post("/decode", json={"ids": [ids], "skip_special_tokens": False}).json()
    assert kept == [tokenizer.decode(ids, skip_special_tokens=False)]
    bad = http.post("/decode", json={"ids": [[1], [10**7]]})
    assert bad.status_code == 422 and bad.json()["error"].startswith("ids[1]:")

    gpt = http.post("/tokenize", json={"inputs": "KING:", "model": "gpt"}).json()[0]
    gpt_ids = [t["id"] for t in gpt]
    assert http.post("/decode", json={"ids": gpt_ids, "model": "gpt"}).json() == ["KING:"]

    info = http.get("/info").json()
    assert info["model_id"] == "bert-embedder" and info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["max_input_length"] == 64 and info["max_client_batch_size"] == 8
    labels = http.get("/info", params={"model": "bert-classifier"}).json()["model_type"]["classifier"]
    assert labels["label2id"] == {label: int(i) for i, label in labels["id2label"].items()}


@pytest.mark.parametrize(
    ("path", "body", "status", "error_type", "field"),
    [
        ("/embed", {"inputs": []}, 400, "Empty", "inputs"),
        ("/embed", {"inputs": ["a", " "]}, 422, "Validation", "inputs[1]"),
        ("/embed", {"inputs": ["a"] * 9}, 422, "Validation", "inputs"),
        ("/embed", {"inputs": "a", "dimensions": 3}, 422, "Validation", "dimensions"),
        ("/embed", {"inputs": [[1, 2]]}, 422, "Validation", "inputs"),
        ("/predict", {"inputs": "a", "raw_scores": True}, 422, "Validation", "raw_scores"),
        ("/tokenize", {"inputs": "a", "model": "vit"}, 422, "Validation", "model"),
        ("/decode", {"ids": []}, 400, "Empty", "ids"),
        ("/similarity", {"inputs": {"source_sentence": "a", "sentences": []}}, 400, "Empty", "inputs.sentences"),
        ("/models/bert-tagger", {"inputs": "a", "parameters": {"aggregation_strategy": "x"}}, 422, "Validation",
         "parameters.aggregation_strategy"),
        ("/models/bert-embedder", {"inputs": "a", "prompt_name": "q"}, 422, "Validation", "prompt_name"),
        ("/models/bert-embedder", {"inputs": "a", "parameters": {"dimensions": 0}}, 422, "Validation",
         "parameters.dimensions"),
        ("/models/bert-qa", {"inputs": {"question": "a"}}, 422, "Validation", "inputs.context"),
    ],
)  # fmt: skip
def test_tei_bad_input(
    http: httpx.Client, path: str, body: dict[str, Any], status: int, error_type: str, field: str
) -> None:
    answer = http.post(path, json=body)
    assert answer.status_code == status, answer.text
    assert answer.json()["error_type"] == error_type, answer.text
    assert answer.json()["error"].startswith(f"{field}:"), answer.text


def test_vllm_tokenize_and_detokenize(http: httpx.Client, tiny_models: Path) -> None:
    tokenizer = Tokenizer.from_file(str(tiny_models / "gpt" / "tokenizer.json"))
    answer = http.post("/tokenize", json={"prompt": "KING: hello", "return_token_strs": True})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["tokens"] == tokenizer.encode("KING: hello").ids and body["count"] == len(body["tokens"])
    assert body["max_model_len"] == 64 and "".join(body["token_strs"]) == "KING: hello"
    assert http.post("/detokenize", json={"tokens": body["tokens"]}).json() == {"prompt": "KING: hello"}

    messages = [{"role": "user", "content": "Who goes there?"}]
    chat = http.post("/tokenize", json={"model": "gpt", "messages": messages}).json()
    body = {"model": "gpt", "messages": messages, "max_tokens": 1}
    completion = http.post("/v1/chat/completions", json=body).json()
    assert chat["count"] == completion["usage"]["prompt_tokens"]  # the template the chat route renders
    refused = http.post("/tokenize", json={"prompt": "a", "messages": messages})
    assert refused.status_code == 422 and refused.json()["error"].startswith("prompt:")
    bad = http.post("/detokenize", json={"tokens": [10**7]})
    assert bad.status_code == 422 and bad.json()["error"].startswith("tokens:")


def test_pair_positions_cut_the_longer_text_first() -> None:
    # [CLS] a0..a5 [SEP] b0 b1 [SEP]: 11 tokens into 8 take three from the longer first text
    mask = [1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 1]
    types = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1]
    assert pair_positions(mask, types, 8, Truncation(), 0) == [0, 1, 2, 3, 7, 8, 9, 10]
    assert pair_positions(mask, types, 8, Truncation(side="left"), 0) == [0, 4, 5, 6, 7, 8, 9, 10]
    assert pair_positions(mask, types, 5, Truncation(), 0) == [0, 1, 7, 8, 10]  # then one from each, in turn
    assert pair_positions(mask, types, 11, Truncation(cut=False), 0) == list(range(11))
