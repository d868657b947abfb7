"""Bring your own model: small random-weight checkpoints of every family, imported and served.

Each checkpoint is built here with ``transformers``' own config and ``save_pretrained`` and a tokenizer
trained on the shared data (``tests/hf_checkpoints.py``); nothing is downloaded. Each is imported by
``python -m model_export import`` (its ``main``), variants included, and then asked through the
running service, on its doors, against the checkpoint's own model in ``transformers``: logits within
1e-4 (the import's checks, in the manifest and in ``/v1/models``), labels and entities equal to
``transformers``' pipelines, QA spans equal to its span selection over the same windows, embeddings
at cosine >= 0.9999 against sentence-transformers, GPT-2's greedy and Marian's greedy and 4-beam
tokens equal to ``generate()``. Then what the import refuses, and a published version under load.
"""

from __future__ import annotations

import base64
import io
import json
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import hf_checkpoints
import httpx
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from servers import LiveServer

from harness.ports import free_port
from model_export.__main__ import main as export_main
from model_export.importing.checkpoint import inspect
from model_export.importing.checks import SAMPLE_TEXTS, sample_images
from service.settings import Settings

pytest.importorskip("transformers")

# name -> (family builder, task)
MODELS = {
    "hf-classifier": ("bert", "text-classification"),
    "hf-tagger": ("distilbert", "token-classification"),
    "hf-qa": ("bert", "question-answering"),
    "hf-embedder": ("bert", "feature-extraction"),
    "hf-gpt2": ("gpt2", "text-generation"),
    "hf-marian": ("marian", "translation"),
    "hf-vit": ("vit", "image-classification"),
}
TEXTS = [*SAMPLE_TEXTS, "Ada Lovelace wrote the first program in London.", "a gorgeous , witty film"]


def build_checkpoint(folder: Path, data_dir: Path, family: str, task: str, seed: int = 0) -> Path:
    if family in ("bert", "distilbert"):
        return hf_checkpoints.bert(folder, data_dir, task, family, seed)
    if family == "gpt2":
        return hf_checkpoints.gpt2(folder, data_dir, seed)
    if family == "marian":
        return hf_checkpoints.marian(folder, data_dir, seed)
    return hf_checkpoints.vit(folder, seed)


def run_import(*args: str) -> int:
    return export_main(["import", *args])


@pytest.fixture(scope="module")
def data_dir() -> Path:
    from model_export.data import resolve_data_dir

    return resolve_data_dir(None)


@pytest.fixture(scope="module")
def imported_models(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> tuple[Path, Path]:
    """(checkpoints, repository): every family's checkpoint, imported with its variants."""
    checkpoints = tmp_path_factory.mktemp("checkpoints")
    repository = tmp_path_factory.mktemp("imported")
    for name, (family, task) in MODELS.items():
        build_checkpoint(checkpoints / name, data_dir, family, task)
        assert (
            run_import(str(checkpoints / name), "--task", task, "--name", name, "--out", str(repository)) == 0
        )
    return checkpoints, repository


@pytest.fixture(scope="module")
def server(imported_models: tuple[Path, Path]) -> Any:
    _, repository = imported_models
    port = free_port()
    with LiveServer(Settings(MODEL_REPOSITORY=repository, MAX_QUEUE_DELAY_MS=2, GRPC_PORT=port)) as live:
        live.grpc_url = f"127.0.0.1:{port}"  # type: ignore[attr-defined]
        yield live


def post(server: Any, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(f"{server.url}{path}", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return dict(r.json())


def manifest(repository: Path, name: str) -> dict[str, Any]:
    return dict(json.loads((repository / name / "manifest.json").read_text()))


def hf(checkpoints: Path, name: str) -> Any:
    """The checkpoint's own model in transformers, as a user loads it."""
    from model_export.importing.checks import reference_model

    return reference_model(inspect(checkpoints / name, MODELS[name][1]))


def hf_tokenizer(checkpoints: Path, name: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(checkpoints / name))


# --- the import's own checks, recorded -------------------------------------------------------------


@pytest.mark.parametrize("name", list(MODELS))
def test_every_task_imports_with_its_checks_recorded(imported_models: tuple[Path, Path], name: str) -> None:
    checkpoints, repository = imported_models
    m = manifest(repository, name)
    assert m["task"] == MODELS[name][1]
    checks = m["checks"]
    assert checks["passed"] is True
    if "logits_max_abs_diff" in checks:
        assert checks["logits_max_abs_diff"] <= 1e-4
    if "embedding_min_cosine" in checks:
        assert checks["embedding_min_cosine"] >= 0.9999
    for key in (
        k
        for k in checks
        if k.endswith(("_equal_to_pipeline", "_equal_to_generate", "_equal_to_transformers", "ids_equal"))
    ):
        got, total = checks[key].split("/")
        assert got == total, f"{name}: {key} {checks[key]}"
    origin = m["origin"]
    assert origin["sha256"] == inspect(checkpoints / name, MODELS[name][1]).origin()["sha256"]
    assert set(m["variants"]) >= {"fused", "fp16"}
    assert m["variants"]["fused"]["metric"] == "agreement"


def test_labels_special_tokens_and_preprocessing_come_from_the_checkpoint(
    imported_models: tuple[Path, Path],
) -> None:
    checkpoints, repository = imported_models
    assert manifest(repository, "hf-classifier")["labels"] == ["negative", "positive"]
    assert manifest(repository, "hf-tagger")["labels"] == hf_checkpoints.TAGS
    marian = manifest(repository, "hf-marian")
    vocab = json.loads((checkpoints / "hf-marian" / "vocab.json").read_text())
    assert marian["special_tokens"]["decoder_start"] == marian["special_tokens"]["pad"] == vocab["<pad>"]
    assert marian["special_tokens"]["eos"] == vocab["</s>"]
    assert marian["suppress_tokens"] == [vocab["<pad>"]]
    assert marian["origin"]["tokenizer"]["equal"] is True  # source.spm converted and checked on text
    vit = manifest(repository, "hf-vit")["preprocessing"]
    assert vit["color_mode"] == "RGB" and vit["image_size"] == [32, 32] and vit["mean"] == [0.5, 0.5, 0.5]
    assert manifest(repository, "hf-embedder")["max_sequence_length"] == 48  # sentence_bert_config.json


def test_attention_fuses_and_the_decoders_update_their_cache_in_place(
    imported_models: tuple[Path, Path], server: Any
) -> None:
    _, repository = imported_models
    for name in MODELS:
        fused = manifest(repository, name)["variants"]["fused"]
        assert all(counts.get("Attention", 0) > 0 for counts in fused["op_counts"].values()), name
    listed = {m["id"]: m for m in httpx.get(f"{server.url}/v1/models", timeout=30).json()["data"]}
    for name, graph in (("hf-gpt2", "model"), ("hf-marian", "decoder")):
        fused = manifest(repository, name)["variants"]["fused"]
        assert graph in fused["inplace_decode"] and fused["inplace_max_abs_diff"] <= 1e-4
        assert listed[name]["kv_cache"] == "inplace"  # what the generation tests below decode with


# --- through the running service ---------------------------------------------------------------------


def test_v1_models_reports_origin_and_check_figures(server: Any) -> None:
    listed = {m["id"]: m for m in httpx.get(f"{server.url}/v1/models", timeout=30).json()["data"]}
    assert set(MODELS) <= set(listed)
    for name, (_, task) in MODELS.items():
        assert listed[name]["default_for"] == [task]  # the only model of its task: the playground's
        assert listed[name]["origin"]["architecture"]
        assert len(listed[name]["origin"]["sha256"]) == 64
        assert listed[name]["checks"]["passed"] is True


def test_classifier_answers_as_the_text_classification_pipeline(
    imported_models: tuple[Path, Path], server: Any
) -> None:
    from transformers import pipeline

    checkpoints, _ = imported_models
    classify = pipeline(
        "text-classification",
        model=hf(checkpoints, "hf-classifier"),
        tokenizer=hf_tokenizer(checkpoints, "hf-classifier"),
    )
    served = post(server, "/v1/classify", {"texts": TEXTS, "model": "hf-classifier"})["results"]
    for got, want in zip(served, classify(TEXTS), strict=True):
        assert got["label"] == want["label"]
        assert got["score"] == pytest.approx(want["score"], abs=1e-4)
    again = post(server, "/v1/classify", {"texts": TEXTS, "model": "hf-classifier"})
    assert again["cached"] is True  # the response cache serves an imported model as any
    playground = post(server, "/v1/classify", {"text": TEXTS[0]})  # no model named, as the playground asks
    assert playground["model"] == "hf-classifier" and playground["results"][0]["label"] == served[0]["label"]


def test_tagger_entities_equal_the_pipelines_simple_aggregation(
    imported_models: tuple[Path, Path], server: Any
) -> None:
    from transformers import pipeline

    checkpoints, _ = imported_models
    tag = pipeline(
        "token-classification",
        model=hf(checkpoints, "hf-tagger"),
        tokenizer=hf_tokenizer(checkpoints, "hf-tagger"),
        aggregation_strategy="simple",
    )
    served = post(server, "/v1/extract", {"task": "entities", "texts": TEXTS, "model": "hf-tagger"})[
        "results"
    ]
    compared = 0
    for text, got, want in zip(TEXTS, served, tag(TEXTS), strict=True):
        assert [(e["label"], e["start"], e["end"]) for e in got["entities"]] == [
            (e["entity_group"], e["start"], e["end"]) for e in want
        ], text
        for e, w in zip(got["entities"], want, strict=True):
            assert e["score"] == pytest.approx(float(w["score"]), abs=1e-4)
            assert e["text"] == text[e["start"] : e["end"]]
        compared += len(want)
    assert compared > 10  # a random head tags plenty


def test_qa_spans_equal_transformers_over_the_same_windows(
    imported_models: tuple[Path, Path], server: Any
) -> None:
    from model_export.importing.checks import _qa_reference

    checkpoints, repository = imported_models
    qa = manifest(repository, "hf-qa")
    window, stride = qa["max_sequence_length"], qa["qa"]["stride"]
    model, tokenizer = hf(checkpoints, "hf-qa"), hf_tokenizer(checkpoints, "hf-qa")
    context = " ".join(TEXTS * 2)
    for question in ("Who wrote the first program?", "What is witty?", "Where do dogs play?"):
        got = post(
            server, "/v1/extract", {"task": "qa", "question": question, "context": context, "model": "hf-qa"}
        )
        answer = got["results"][0]
        assert answer["windows"] > 1  # the context spans several windows: the choice between them is checked
        start, end, score = _qa_reference(
            tokenizer, model, question, context, window, stride, qa["qa"]["max_answer_length"]
        )
        assert (answer["start"], answer["end"]) == (start, end)
        assert answer["score"] == pytest.approx(score, abs=1e-4)
        assert answer["answer"] == context[start:end]


def test_embeddings_match_sentence_transformers_on_rest_and_openai(
    imported_models: tuple[Path, Path], server: Any
) -> None:
    from openai import OpenAI
    from sentence_transformers import SentenceTransformer

    checkpoints, _ = imported_models
    st = SentenceTransformer(str(checkpoints / "hf-embedder"), device="cpu")
    expected = st.encode(TEXTS, normalize_embeddings=True)
    rest = np.array(
        [
            r["embedding"]
            for r in post(server, "/v1/embed", {"texts": TEXTS, "model": "hf-embedder"})["results"]
        ]
    )
    client = OpenAI(base_url=f"{server.url}/v1", api_key="any")
    openai = np.array([d.embedding for d in client.embeddings.create(model="hf-embedder", input=TEXTS).data])
    for got in (rest, openai):
        assert (got * expected).sum(-1).min() >= 0.9999


def test_gpt2_greedy_tokens_equal_generate_on_rest_and_openai(
    imported_models: tuple[Path, Path], server: Any
) -> None:
    import torch
    from openai import OpenAI

    checkpoints, _ = imported_models
    model, tokenizer = hf(checkpoints, "hf-gpt2"), hf_tokenizer(checkpoints, "hf-gpt2")
    client = OpenAI(base_url=f"{server.url}/v1", api_key="any")
    for prompt in ("ROMEO:\n", "First Citizen:\nBefore we proceed", "KING HENRY"):
        ids = tokenizer(prompt).input_ids
        with torch.no_grad():
            out = model.generate(
                torch.tensor([ids]), max_new_tokens=16, do_sample=False, pad_token_id=tokenizer.eos_token_id
            )
        expected = tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True)
        rest = post(
            server,
            "/v1/generate",
            {"prompt": prompt, "max_new_tokens": 16, "temperature": 0, "model": "hf-gpt2"},
        )
        assert rest["results"][0]["text"] == expected
        done = client.completions.create(model="hf-gpt2", prompt=prompt, max_tokens=16, temperature=0)
        assert done.choices[0].text == expected


def test_marian_greedy_and_beam_tokens_equal_generate(
    imported_models: tuple[Path, Path], server: Any
) -> None:
    import torch

    checkpoints, _ = imported_models
    model, tokenizer = hf(checkpoints, "hf-marian"), hf_tokenizer(checkpoints, "hf-marian")
    sources = ["A man is riding a bicycle.", "Two dogs play in the snow.", "A woman in a red coat sings."]
    for beams in (1, 4):
        inputs = tokenizer(sources, return_tensors="pt", padding=True)
        with torch.no_grad():
            out = model.generate(**inputs, num_beams=beams, max_new_tokens=16, do_sample=False)
        expected = tokenizer.batch_decode(out, skip_special_tokens=True)
        body = {"texts": sources, "beam_size": beams, "max_new_tokens": 16, "model": "hf-marian"}
        served = post(server, "/v1/translate", body)["results"]
        assert [r["text"] for r in served] == expected, beams


def test_vit_answers_as_the_image_classification_pipeline(
    imported_models: tuple[Path, Path], server: Any
) -> None:
    from PIL import Image
    from transformers import AutoImageProcessor, pipeline

    checkpoints, _ = imported_models
    processor = AutoImageProcessor.from_pretrained(str(checkpoints / "hf-vit"))
    classify = pipeline("image-classification", model=hf(checkpoints, "hf-vit"), image_processor=processor)
    for png in sample_images(32, count=4, seed=3):
        want = classify(Image.open(io.BytesIO(png)), top_k=1)[0]
        got = post(server, "/v1/classify", {"image": base64.b64encode(png).decode(), "model": "hf-vit"})[
            "results"
        ][0]
        assert got["label"] == want["label"]
        assert got["score"] == pytest.approx(want["score"], abs=1e-4)


def test_imported_models_answer_on_v2_and_grpc_with_attention_maps_where_their_graphs_allow(
    server: Any,
) -> None:
    texts = ["a gorgeous film", "dull"]
    rest = post(server, "/v1/classify", {"texts": texts, "model": "hf-classifier"})["results"]
    for triton in (thttp, tgrpc):
        url = server.url.removeprefix("http://") if triton is thttp else server.grpc_url
        client = triton.InferenceServerClient(url)
        tensor = triton.InferInput("text", [2], "BYTES")
        tensor.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object))
        result = client.infer("hf-classifier", [tensor])
        assert [v.decode() for v in result.as_numpy("label")] == [r["label"] for r in rest]
        client.close()
    for path, body in (
        ("/v1/classify", {"text": "a gorgeous film", "model": "hf-classifier"}),
        ("/v1/extract", {"task": "entities", "text": "Ada lived in London.", "model": "hf-tagger"}),
        ("/v1/translate", {"text": "A man rides.", "model": "hf-marian", "max_new_tokens": 4}),
        ("/v1/classify", {"image": base64.b64encode(sample_images(32, 1)[0]).decode(), "model": "hf-vit"}),
    ):
        attention = post(server, path, {**body, "return_attention": True})["results"][0]["attention"]
        weights = np.array(attention["weights"])
        assert weights.size and np.all(weights >= 0)


# --- what the import refuses -----------------------------------------------------------------------------


def _edited(checkpoints: Path, tmp_path: Path, name: str, **config: Any) -> Path:
    copy = tmp_path / name
    shutil.copytree(checkpoints / name, copy)
    if config:
        path = copy / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    return copy


def test_refusals_name_what_is_missing(
    imported_models: tuple[Path, Path], tmp_path: Path, capsys: Any
) -> None:
    checkpoints, _ = imported_models
    out = str(tmp_path / "out")
    cases = [
        (
            _edited(checkpoints, tmp_path / "a", "hf-classifier", model_type="xlnet"),
            "text-classification",
            "model_type 'xlnet'",
        ),
        (
            _edited(checkpoints, tmp_path / "b", "hf-classifier", architectures=["BertForMaskedLM"]),
            "text-classification",
            "no text-classification head",
        ),
        (
            _edited(checkpoints, tmp_path / "c", "hf-classifier", problem_type="multi_label_classification"),
            "text-classification",
            "problem_type",
        ),
        (
            _edited(checkpoints, tmp_path / "d", "hf-marian", share_encoder_decoder_embeddings=False),
            "translation",
            "share_encoder_decoder_embeddings",
        ),
        (checkpoints / "hf-gpt2", "translation", "serves text-generation, not translation"),
    ]
    no_tokenizer = _edited(checkpoints, tmp_path / "e", "hf-tagger")
    for file in ("tokenizer.json", "tokenizer_config.json"):
        (no_tokenizer / file).unlink()
    cases.append((no_tokenizer, "token-classification", "tokenizer"))
    crop = _edited(checkpoints, tmp_path / "f", "hf-vit")
    processor = json.loads((crop / "preprocessor_config.json").read_text())
    (crop / "preprocessor_config.json").write_text(json.dumps({**processor, "do_center_crop": True}))
    cases.append((crop, "image-classification", "center crop"))
    forced = _edited(checkpoints, tmp_path / "g", "hf-gpt2")
    generation = json.loads((forced / "generation_config.json").read_text())
    (forced / "generation_config.json").write_text(json.dumps({**generation, "no_repeat_ngram_size": 3}))
    cases.append((forced, "text-generation", "no_repeat_ngram_size"))
    for folder, task, reason in cases:
        capsys.readouterr()
        assert run_import(str(folder), "--task", task, "--name", "refused", "--out", out) == 2
        err = capsys.readouterr().err
        assert "import refused" in err and reason in err, err
    assert not (tmp_path / "out" / "refused").exists()


def test_data_measures_the_variants_rule_on_the_users_examples(
    imported_models: tuple[Path, Path], tmp_path: Path
) -> None:
    checkpoints, _ = imported_models
    data = tmp_path / "labelled.jsonl"
    data.write_text(
        "".join(
            json.dumps({"text": t, "label": ["negative", "positive"][i % 2]}) + "\n"
            for i, t in enumerate(TEXTS)
        )
    )
    out = tmp_path / "out"
    assert (
        run_import(
            str(checkpoints / "hf-classifier"),
            "--task",
            "text-classification",
            "--name",
            "c",
            "--out",
            str(out),
            "--data",
            str(data),
        )
        == 0
    )
    m = manifest(out, "c")
    assert m["validation"]["--data"]["examples"] == len(TEXTS)
    assert m["variants"]["fused"]["metric"] == "accuracy"
    assert m["variants"]["fused"]["tolerance"] == 0.01


def test_a_bert_vocab_txt_without_tokenizer_json_is_converted_and_checked(
    imported_models: tuple[Path, Path], tmp_path: Path
) -> None:
    from tokenizers import Tokenizer

    checkpoints, _ = imported_models
    folder = _edited(checkpoints, tmp_path, "hf-classifier")
    vocab = Tokenizer.from_file(str(folder / "tokenizer.json")).get_vocab()
    (folder / "vocab.txt").write_text("".join(f"{token}\n" for token in sorted(vocab, key=vocab.get)))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.update(tokenizer_class="BertTokenizer", do_lower_case=True)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "tokenizer.json").unlink()
    out = tmp_path / "out"
    args = ["--task", "text-classification", "--name", "c", "--out", str(out), "--no-variants"]
    assert run_import(str(folder), *args) == 0
    m = manifest(out, "c")
    assert m["origin"]["tokenizer"] == {"converted_from": "BertTokenizer", "checked_texts": 5, "equal": True}
    assert m["checks"]["labels_equal_to_pipeline"] == "5/5"


# --- a published version under load ------------------------------------------------------------------


def test_an_imported_version_published_into_a_polling_server_answers_with_no_non_200(
    imported_models: tuple[Path, Path], tmp_path: Path, data_dir: Path
) -> None:
    checkpoints, _ = imported_models
    repository = tmp_path / "live"
    source = checkpoints / "hf-classifier"
    args = [
        "--task",
        "text-classification",
        "--name",
        "sentiment",
        "--out",
        str(repository),
        "--publish-version",
    ]
    assert run_import(str(source), *args) == 0
    retrained = build_checkpoint(tmp_path / "retrained", data_dir, "bert", "text-classification", seed=1)
    settings = Settings(
        MODEL_REPOSITORY=repository,
        MODEL_CONTROL_MODE="poll",
        MODEL_REPOSITORY_POLL_S=0.2,
        CACHE_ENABLED=False,
    )
    with LiveServer(settings) as live:
        first = httpx.get(f"{live.url}/v1/models", timeout=30).json()["data"][0]["version"]
        statuses: list[int] = []
        per_client: list[list[str]] = [[] for _ in range(4)]  # each client's versions, in its own order
        stop = threading.Event()

        def client(seen: list[str]) -> None:
            with httpx.Client(base_url=live.url, timeout=60) as c:
                while not stop.is_set():
                    r = c.post("/v1/classify", json={"texts": ["a fine film", "dull"], "model": "sentiment"})
                    statuses.append(r.status_code)
                    if r.status_code == 200:
                        seen.append(r.json()["model_version"])

        threads = [threading.Thread(target=client, args=(seen,), daemon=True) for seen in per_client]
        for t in threads:
            t.start()
        assert run_import(str(retrained), *args) == 0
        assert (repository / "sentiment" / "2" / "manifest.json").is_file()
        new = manifest(repository / "sentiment", "2")["version"]
        deadline = time.monotonic() + 60
        while not all(new in seen[-2:] for seen in per_client) and time.monotonic() < deadline:
            time.sleep(0.1)
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert statuses and set(statuses) == {200}, f"non-200 answers: {sorted(set(statuses) - {200})}"
    assert first != new
    for seen in per_client:  # one request after another: the version switches once and never goes back
        assert seen[0] == first and new in seen
        assert set(seen[seen.index(new) :]) == {new}


# --- the real all-MiniLM-L6-v2 the set-up fetches ---------------------------------------------------------


@pytest.mark.checkpoint
def test_the_real_minilm_checkpoint_imports_as_sentence_transformers_embeds(tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer

    from model_export.hf_checkpoint import DEFAULT_CHECKPOINT_DIR

    if not (DEFAULT_CHECKPOINT_DIR / "config.json").is_file():
        pytest.skip("the all-MiniLM-L6-v2 checkpoint is not fetched (make setup, offline)")
    out = tmp_path / "models"
    assert (
        run_import(
            str(DEFAULT_CHECKPOINT_DIR),
            "--task",
            "feature-extraction",
            "--name",
            "minilm",
            "--out",
            str(out),
            "--no-variants",
        )
        == 0
    )
    m = manifest(out, "minilm")
    assert m["checks"]["embedding_min_cosine"] >= 0.9999
    assert m["max_sequence_length"] == 256  # its sentence_bert_config.json
    st = SentenceTransformer(str(DEFAULT_CHECKPOINT_DIR), device="cpu")
    expected = st.encode(TEXTS, normalize_embeddings=True)
    with LiveServer(Settings(MODEL_REPOSITORY=out)) as live:
        got = np.array(
            [r["embedding"] for r in post(live, "/v1/embed", {"texts": TEXTS, "model": "minilm"})["results"]]
        )
    assert (got * expected).sum(-1).min() >= 0.9999
