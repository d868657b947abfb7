"""``python -m model_export import DIR --task rerank``: cross-encoders brought in, served, and asked.

Three small random-weight one-label sequence classifiers are built here with ``transformers`` (nothing is
downloaded): a BERT saved as ``save_pretrained`` saves it, the same model saved by sentence-transformers'
``CrossEncoder.save`` (its ``modules.json``, ``config_sentence_transformers.json`` and a 48-token window),
and a DistilBERT. Each is imported by the CLI's ``main`` and served; the answers are compared with the
checkpoint's own libraries: ``/v1/rerank``'s relevance scores with ``CrossEncoder.predict`` (the logit's
sigmoid), TEI's ``/rerank`` raw scores with ``AutoModelForSequenceClassification``'s logits on the
tokenizer's pair encoding; a CrossEncoder that declares the identity (as ms-marco's do) is served its logit
as the score, as ``predict`` answers. Then what the import refuses: a two-label head, a declared activation
other than those two, a module after the model, a one-label head imported as text-classification.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hf_checkpoints
import httpx
import numpy as np
import pytest
from servers import LiveServer

from model_export.__main__ import main as export_main
from model_export.tokenization import train_wordpiece
from service.settings import Settings

pytest.importorskip("transformers")
pytest.importorskip("sentence_transformers")

pytestmark = pytest.mark.slow  # about a minute on 2 cores: four checkpoints built, three imported, one server

QUERY = "Who watches the dogs play in the snow?"
DOCUMENTS = [
    "Two dogs play in the snow, and a child watches them!",
    "The café on 5th Avenue opens at 7:30 a.m.",
    "A man is riding a bicycle down the street.",
    "ok",
    # longer than either window (64, 48): the document loses its end, as transformers' longest_first cuts
    "Numbers 12345 and symbols (in brackets) and a very long paragraph about dogs and snow. " * 6,
]
# name -> (family, how it is saved)
CHECKPOINTS = {
    "bert-ce": ("bert", "save_pretrained"),
    "st-ce": ("bert", "CrossEncoder.save"),
    "distil-ce": ("distilbert", "save_pretrained"),
    "id-ce": ("bert", "CrossEncoder.save, the identity declared (as ms-marco's cross-encoders declare it)"),
}
WINDOWS = {"bert-ce": 64, "st-ce": 48, "distil-ce": 64, "id-ce": 48}
SIGMOID, IDENTITY = "torch.nn.modules.activation.Sigmoid", "torch.nn.modules.linear.Identity"
ACTIVATION = {"st-ce": SIGMOID, "id-ce": IDENTITY}  # declared in config_sentence_transformers.json
SPREAD = 0.2  # the weights' standard deviation: logits tenths apart, fp32 errors below 1e-6


def run_import(*args: str) -> int:
    return export_main(["import", *args])


def _classifier(folder: Path, family: str, labels: int, wordpiece: Any, seed: int = 0) -> Path:
    """A 2-layer, 32-wide sequence classifier with ``labels`` outputs and the WordPiece tokenizer, saved as
    ``transformers`` saves it (tests/hf_checkpoints.py's sizes). Its weights are drawn wide (``SPREAD``):
    at transformers' 0.02 every pair's logit is within 1e-4 of the others, and a score compared at 1e-5
    could not tell one document from another."""
    import torch
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        BertTokenizer,
        DistilBertConfig,
        DistilBertForSequenceClassification,
        DistilBertTokenizer,
    )

    torch.manual_seed(seed)
    if family == "distilbert":
        config: Any = DistilBertConfig(
            vocab_size=800,
            dim=32,
            n_layers=2,
            n_heads=4,
            hidden_dim=64,
            max_position_embeddings=64,
            num_labels=labels,
            initializer_range=SPREAD,
        )
        model: Any = DistilBertForSequenceClassification(config)
    else:
        config = BertConfig(
            vocab_size=800,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=64,
            num_labels=labels,
            initializer_range=SPREAD,
        )
        model = BertForSequenceClassification(config)
    model.eval().save_pretrained(folder)
    kind = DistilBertTokenizer if family == "distilbert" else BertTokenizer
    kind(
        tokenizer_object=wordpiece,
        unk_token="[UNK]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        mask_token="[MASK]",
        model_max_length=64,
    ).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    from sentence_transformers import CrossEncoder

    root = tmp_path_factory.mktemp("cross-encoders")
    wordpiece = train_wordpiece(hf_checkpoints._bert_texts(data_dir), 800, lowercase=True)
    _classifier(root / "bert-ce", "bert", 1, wordpiece)
    CrossEncoder(str(root / "bert-ce"), device="cpu", max_length=48).save(str(root / "st-ce"))
    shutil.copytree(root / "st-ce", root / "id-ce")
    _edit_json(root / "id-ce" / "config_sentence_transformers.json", activation_fn=IDENTITY)
    _classifier(root / "distil-ce", "distilbert", 1, wordpiece, seed=1)
    _classifier(root / "two-labels", "bert", 2, wordpiece, seed=2)
    return root


def ranked_examples() -> list[dict[str, Any]]:
    """``--data`` for a cross-encoder: each query with its documents and the relevant one's index."""
    return [
        {"query": QUERY, "documents": DOCUMENTS, "relevant": 0},
        {"query": "When does the café open?", "documents": DOCUMENTS[:4], "relevant": 1},
        {"query": "Who rides a bicycle?", "documents": DOCUMENTS[1:3], "relevant": 1},
    ]


@pytest.fixture(scope="module")
def repository(checkpoints: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The three imported: bert-ce's variants held to the agreement rule, distil-ce's measured on ``--data``
    (MRR@10), st-ce without variants."""
    out = tmp_path_factory.mktemp("imported")
    data = out.parent / "ranked.jsonl"
    data.write_text("".join(json.dumps(e) + "\n" for e in ranked_examples()))
    extra = {
        "bert-ce": [],
        "st-ce": ["--no-variants"],
        "distil-ce": ["--data", str(data)],
        "id-ce": ["--no-variants"],
    }
    for name in CHECKPOINTS:
        args = [str(checkpoints / name), "--task", "rerank", "--name", name, "--out", str(out), *extra[name]]
        assert run_import(*args) == 0, name
    return out


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[LiveServer]:
    settings = Settings(MODEL_REPOSITORY=repository, MAX_QUEUE_DELAY_MS=2, CACHE_ENABLED=False)
    with LiveServer(settings) as live:
        yield live


def manifest(repository: Path, name: str) -> dict[str, Any]:
    return dict(json.loads((repository / name / "manifest.json").read_text()))


def post(server: LiveServer, path: str, body: dict[str, Any]) -> Any:
    r = httpx.post(f"{server.url}{path}", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def transformers_logits(folder: Path, window: int) -> np.ndarray:
    """The checkpoint's logits in transformers itself, on its tokenizer's pair encoding cut to ``window``."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForSequenceClassification.from_pretrained(str(folder), dtype="float32").eval()
    encoded = tokenizer(
        [QUERY] * len(DOCUMENTS),
        DOCUMENTS,
        padding=True,
        truncation=True,
        max_length=window,
        return_tensors="pt",
    )
    with torch.no_grad():
        return np.asarray(model(**encoded).logits[:, 0].numpy(), dtype=np.float64)


# --- the import's own record -------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CHECKPOINTS))
def test_each_imports_as_a_rerank_model_with_its_checks(repository: Path, name: str) -> None:
    m = manifest(repository, name)
    assert m["task"] == "rerank" and "labels" not in m
    assert m["max_sequence_length"] == WINDOWS[name]  # st-ce: CrossEncoder(max_length=48)'s window
    assert {"pad", "unk", "cls", "sep"} <= set(m["special_tokens"])
    (output,) = m["graphs"]["model"]["outputs"]
    assert output["name"] == "logits" and output["shape"] == ["batch", 1]
    inputs = [i["name"] for i in m["graphs"]["model"]["inputs"]]
    expected_inputs = ["input_ids", "attention_mask"] + (["token_type_ids"] if name != "distil-ce" else [])
    assert inputs == expected_inputs
    assert "attention_maps" not in m  # as the house's reranker: the cross-encoder pipeline serves none
    checks = m["checks"]
    assert checks["passed"] is True
    assert checks["logits_max_abs_diff"] <= 1e-4
    assert checks["score_max_abs_diff_to_cross_encoder"] <= 1e-4
    got, total = checks["pairs_equal_to_tokenizer"].split("/")
    assert got == total and int(total) > 0
    assert checks["pairs_truncated"] > 0  # the check's long document was cut to the window
    declared = ACTIVATION.get(name)
    assert m["ranking"]["activation"] == declared or (
        declared is None and "none declared" in m["ranking"]["activation"]
    )
    assert m["ranking"]["score"] == ("identity" if declared == IDENTITY else "sigmoid")  # what is served


def test_variants_are_held_to_top_document_agreement_or_to_mrr_on_data(repository: Path) -> None:
    fused = manifest(repository, "bert-ce")["variants"]["fused"]
    assert fused["metric"] == "agreement"
    assert fused["validation"]["examples"] >= 3  # queries, each ranking its candidate documents
    assert 0.0 <= fused["validation"]["agreement"] <= 1.0
    assert fused["serve_by_default"] == (fused["validation"]["agreement"] >= 0.99)
    measured = manifest(repository, "distil-ce")
    assert measured["validation"]["--data"]["examples"] == len(ranked_examples())
    assert 0.0 < measured["validation"]["--data"]["mrr_at_10"] <= 1.0
    assert measured["variants"]["fused"]["metric"] == "mrr_at_10"  # variants.RULES["rerank"]
    assert measured["variants"]["fused"]["tolerance"] == 0.01
    assert "variants" not in manifest(repository, "st-ce")  # --no-variants


# --- through the running service ---------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CHECKPOINTS))
def test_v1_rerank_scores_are_cross_encoder_predict(checkpoints: Path, server: LiveServer, name: str) -> None:
    from sentence_transformers import CrossEncoder

    expected = CrossEncoder(str(checkpoints / name), device="cpu").predict(
        [(QUERY, d) for d in DOCUMENTS], convert_to_numpy=True, show_progress_bar=False
    )
    body = post(server, "/v1/rerank", {"model": name, "query": QUERY, "documents": DOCUMENTS})
    assert body["model"] == name and body["scored_by"] == "cross-encoder"
    assert np.ptp(expected) > 0.02  # the documents' scores stand far apart next to the 1e-5 compared
    scores = {r["index"]: r["relevance_score"] for r in body["results"]}
    assert sorted(scores) == list(range(len(DOCUMENTS)))
    assert [scores[i] for i in range(len(DOCUMENTS))] == pytest.approx(list(expected), abs=1e-5)
    assert [r["index"] for r in body["results"]] == list(np.argsort(-expected, kind="stable"))


@pytest.mark.parametrize("name", list(CHECKPOINTS))
def test_tei_raw_scores_are_transformers_logits(checkpoints: Path, server: LiveServer, name: str) -> None:
    logits = transformers_logits(checkpoints / name, WINDOWS[name])
    ranks = post(server, "/rerank", {"model": name, "query": QUERY, "texts": DOCUMENTS, "raw_scores": True})
    assert sorted(r["index"] for r in ranks) == list(range(len(DOCUMENTS)))
    assert np.ptp(logits) > 0.1  # the documents' logits stand far apart next to the 1e-5 compared
    assert {r["index"]: r["score"] for r in ranks} == pytest.approx(dict(enumerate(logits)), abs=1e-5)
    assert [r["index"] for r in ranks] == list(np.argsort(-logits, kind="stable"))  # best first


# --- refused -----------------------------------------------------------------------------------------


def _copy(checkpoints: Path, tmp_path: Path, name: str, into: str) -> Path:
    return Path(shutil.copytree(checkpoints / name, tmp_path / into))


def _edit_json(path: Path, **changes: Any) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_refusals_name_the_field(
    checkpoints: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    softplus = _copy(checkpoints, tmp_path, "st-ce", "softplus")
    _edit_json(
        softplus / "config_sentence_transformers.json", activation_fn="torch.nn.modules.activation.Softplus"
    )
    tanh = _copy(checkpoints, tmp_path, "bert-ce", "tanh")  # sentence-transformers < 4 kept it in config.json
    _edit_json(tanh / "config.json", sbert_ce_default_activation_function="torch.nn.modules.activation.Tanh")
    dense = _copy(checkpoints, tmp_path, "st-ce", "dense")
    modules = json.loads((dense / "modules.json").read_text())
    modules.append({"idx": 1, "name": "1", "path": "1_Dense", "type": "sentence_transformers.models.Dense"})
    (dense / "modules.json").write_text(json.dumps(modules))
    data = tmp_path / "ranked.jsonl"
    data.write_text(json.dumps({"query": QUERY, "documents": DOCUMENTS[:2], "relevant": 2}) + "\n")
    cases: list[tuple[Path, str, list[str], str]] = [
        (checkpoints / "two-labels", "rerank", [], "num_labels is 2"),
        (softplus, "rerank", [], "config_sentence_transformers.json activation_fn"),
        (tanh, "rerank", [], "config.json sbert_ce_default_activation_function"),
        (dense, "rerank", [], "modules.json holds 2 modules"),
        (checkpoints / "bert-ce", "text-classification", [], "fewer than 2 labels"),  # as before rerank
        (checkpoints / "bert-ce", "rerank", ["--data", str(data)], "line 1: relevant is 2"),
    ]
    out = tmp_path / "out"
    for folder, task, extra, reason in cases:
        capsys.readouterr()
        args = [str(folder), "--task", task, "--name", "refused", "--out", str(out), *extra]
        assert run_import(*args) == 2, reason
        err = capsys.readouterr().err
        assert err.startswith("import refused: ") and reason in err, err
        assert len(err.strip().splitlines()) == 1, err
    assert not (out / "refused").exists()
