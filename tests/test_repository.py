"""Loading the model repository: a broken folder is refused with one clear log line, the others serve."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import httpx
import pytest
from servers import LiveServer

from service.engine.repository import load_repository
from service.engine.runtime import RuntimeOptions
from service.settings import Settings

CPU = RuntimeOptions(device="cpu")


def damage(repo: Path) -> dict[str, str]:
    """Break three folders in three ways; returns folder -> a phrase its refusal must contain."""
    graph = repo / "vit" / "model.onnx"
    data = bytearray(graph.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte: same size, other content
    graph.write_bytes(bytes(data))
    (repo / "bert-tagger" / "manifest.json").write_text("{not json")
    (repo / "gpt" / "tokenizer.json").unlink()
    return {
        "vit": "sha256",
        "bert-tagger": "not valid JSON",
        "gpt": "tokenizer.json is listed in the manifest but missing",
    }


def test_broken_folders_are_refused_and_the_rest_load(
    model_repo: Path, caplog: pytest.LogCaptureFixture
) -> None:
    expected = damage(model_repo)
    with caplog.at_level(logging.ERROR, logger="service.engine.repository"):
        loaded, refused = load_repository(model_repo, CPU)
    assert set(loaded) == {"translator", "bert-classifier", "bert-qa", "bert-embedder", "bert-reranker"}
    assert set(refused) == set(expected)
    for name, phrase in expected.items():
        assert phrase in refused[name]
        assert (
            sum(name in record.getMessage() for record in caplog.records) == 1
        )  # one line per refused folder


def test_manifest_whose_graph_names_disagree_is_refused(model_repo: Path) -> None:
    path = model_repo / "bert-classifier" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["graphs"]["model"]["inputs"][0]["name"] = "tokens"
    path.write_text(json.dumps(manifest))
    loaded, refused = load_repository(model_repo, CPU, only=["bert-classifier"])
    assert not loaded and "inputs are" in refused["bert-classifier"]


def test_service_with_a_broken_folder_still_serves_the_others(model_repo: Path) -> None:
    damage(model_repo)
    with (
        LiveServer(Settings(MODEL_REPOSITORY=model_repo)) as server,
        httpx.Client(base_url=server.url, timeout=60) as client,
    ):
        assert client.get("/health/ready").status_code == 200
        listing = client.get("/v1/models").json()
        assert {m["name"] for m in listing["data"]} == {
            "translator",
            "bert-classifier",
            "bert-qa",
            "bert-embedder",
            "bert-reranker",
        }
        assert {r["name"] for r in listing["refused"]} == {"vit", "bert-tagger", "gpt"}
        assert client.post("/v1/classify", json={"text": "a fine film"}).status_code == 200
        missing = client.post("/v1/generate", json={"prompt": "KING:"})
        assert missing.status_code in (404, 422) and "model" in missing.text
