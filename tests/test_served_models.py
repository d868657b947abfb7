"""SERVED_MODELS: one process (pod, KServe InferenceService) serves the models it names, and only those.

KServe's unit is one model per InferenceService; deploy/kserve/ gives each its own pod from the same
image and repository, told which model to load with SERVED_MODELS (tests/test_k8s_crds.py checks the
manifests). Here: the loader loads only the named folders, refuses a name without a folder with a
reason, and the running app answers for its models through the REST, OpenAI and v2 doors and for no
other, ready only when it has a model to serve.
"""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest
from servers import LiveServer

from service.engine.repository import load_repository
from service.engine.runtime import RuntimeOptions
from service.settings import Settings

CPU = RuntimeOptions(device="cpu")


def test_setting_reads_a_list_and_defaults_to_every_folder() -> None:
    assert Settings().served_models == []
    assert Settings(SERVED_MODELS="gpt").served_models == ["gpt"]
    assert Settings(SERVED_MODELS=" gpt , vit ").served_models == ["gpt", "vit"]
    assert Settings(SERVED_MODELS='["gpt", "translator"]').served_models == ["gpt", "translator"]


def test_loader_loads_only_the_named_folders(tiny_models: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="service.engine.repository"):
        loaded, refused = load_repository(tiny_models, CPU, only=["gpt", "no-such-model"])
    assert set(loaded) == {"gpt"}
    assert set(refused) == {"no-such-model"}
    assert "SERVED_MODELS names it" in refused["no-such-model"]
    assert sum("no-such-model" in r.getMessage() for r in caplog.records) == 1


def test_service_serves_the_named_model_through_every_door(tiny_models: Path) -> None:
    settings = Settings(MODEL_REPOSITORY=tiny_models, SERVED_MODELS="gpt", DEVICE="cpu")
    with (
        LiveServer(settings) as server,
        httpx.Client(base_url=server.url, timeout=60) as client,
    ):
        ready = client.get("/health/ready")
        assert ready.status_code == 200 and set(ready.json()["models"]) == {"gpt"}
        listing = client.get("/v1/models").json()
        assert [m["name"] for m in listing["data"]] == ["gpt"]
        assert listing["refused"] == []

        generated = client.post("/v1/generate", json={"prompt": "KING:", "max_new_tokens": 4})
        assert generated.status_code == 200 and generated.json()["model"] == "gpt"
        completion = client.post("/v1/completions", json={"model": "gpt", "prompt": "KING:", "max_tokens": 4})
        assert completion.status_code == 200
        assert client.get("/v2/models/gpt/ready").status_code == 200

        # Every other model is simply not here: a clean 4xx naming the model, not a 5xx.
        classify = client.post("/v1/classify", json={"text": "a fine film"})
        assert classify.status_code in (404, 422) and "model" in classify.text
        assert client.get("/v2/models/bert-classifier/ready").status_code in (400, 404)


def test_a_pod_without_its_model_is_not_ready(tiny_models: Path) -> None:
    """KServe (and any readiness probe) must not route to a pod that lacks the model it was told to serve."""
    settings = Settings(MODEL_REPOSITORY=tiny_models, SERVED_MODELS="no-such-model", DEVICE="cpu")
    with (
        LiveServer(settings) as server,
        httpx.Client(base_url=server.url, timeout=60) as client,
    ):
        assert client.get("/health/ready").status_code == 503
        assert client.get("/v2/health/ready").status_code != 200
        refused = {r["name"]: r["reason"] for r in client.get("/v1/models").json()["refused"]}
        assert "SERVED_MODELS names it" in refused["no-such-model"]
