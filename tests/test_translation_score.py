"""POST /v1/translate/score (CTranslate2's score_batch): a translation's log-probability per token and in
total, checked against a recomputation: the decoder's own step-by-step sums for the tokens greedy search
produced, the argmax property against a perturbed translation, and the served numbers against the engine's
in process on the same tiny translator."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from parity import check_close
from servers import LiveServer

from service.engine.repository import load_model
from service.engine.runtime import RuntimeOptions
from service.engine.seq2seq import Seq2SeqModel
from service.pipelines.translate import prepare_source
from service.settings import Settings

SOURCES = ["A man is walking.", "Two young children are playing in the sand."]


@pytest.fixture(scope="module")
def engine(tiny_models: Path) -> Any:
    model = load_model(tiny_models / "translator", RuntimeOptions(device="cpu"))
    assert model.tokenizer is not None
    seq2seq = Seq2SeqModel(model.graphs["encoder"], model.graphs["decoder"], model.manifest)
    sources = [prepare_source(model.manifest, model.tokenizer.encode(s).ids, 48)[0] for s in SOURCES]
    return seq2seq, model.tokenizer, sources


def test_scores_are_what_decoding_summed(engine: Any) -> None:
    seq2seq, _, sources = engine
    greedy = seq2seq.greedy(sources, 16)
    scores = seq2seq.score(sources, [h.tokens for h in greedy])
    for h, lp in zip(greedy, scores, strict=True):
        assert len(lp) == len(h.tokens) + 1  # </s> last
        produced = lp if h.finished else lp[:-1]  # an unfinished hypothesis summed no </s>
        check_close(
            [float(produced.sum())], [h.logprob], atol=1e-4, rtol=0, name_a="scored", name_b="decoded"
        )
    # A perturbed translation: equal up to the changed token, which scores below greedy's argmax there.
    tokens = list(greedy[0].tokens)
    other = list(tokens)
    other[3] = tokens[3] + 1 if tokens[3] + 1 != seq2seq.eos_id else tokens[3] + 2
    best, worse = seq2seq.score(sources[:1] * 2, [tokens, other])
    np.testing.assert_allclose(best[:3], worse[:3], atol=1e-6)
    assert best[3] > worse[3]


@pytest.fixture(scope="module")
def client(tiny_models: Path) -> Iterator[httpx.Client]:
    settings = Settings(MODEL_REPOSITORY=tiny_models, SERVED_MODELS=["translator"], CACHE_ENABLED=False)
    with LiveServer(settings) as server, httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


def test_served_scores(client: httpx.Client, engine: Any) -> None:
    seq2seq, tokenizer, sources = engine
    translations = ["Ein Mann geht.", "Zwei kleine Kinder spielen im Sand."]
    r = client.post("/v1/translate/score", json={"texts": SOURCES, "translations": translations})
    assert r.status_code == 200, r.text
    body = r.json()
    targets = [tokenizer.encode(t, add_special_tokens=False).ids for t in translations]
    expected = seq2seq.score(sources, targets)
    for got, lp, target in zip(body["results"], expected, targets, strict=True):
        assert got["length"] == len(target) + 1 == len(got["tokens"]) and got["tokens"][-1] == "</s>"
        check_close(got["token_logprobs"], lp.tolist(), atol=1e-4, rtol=0, name_a="served", name_b="engine")
        assert got["logprob"] == pytest.approx(sum(got["token_logprobs"]), abs=1e-9)
    assert body["usage"]["output_tokens"] == 0
    one = client.post("/v1/translate/score", json={"text": SOURCES[0], "translation": translations[0]}).json()
    check_close(
        [one["results"][0]["logprob"]],
        [body["results"][0]["logprob"]],
        atol=1e-4,
        rtol=0,
        name_a="a",
        name_b="b",
    )


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"texts": SOURCES, "translations": ["Ein Mann."]}, "translations"),
        ({"text": SOURCES[0]}, "translation"),
        ({"text": SOURCES[0], "translation": "Ein.", "translations": ["Ein."]}, "translation"),
        ({"text": SOURCES[0], "translation": " "}, "translation"),
        ({"text": SOURCES[0], "translation": "Ein " * 100}, "translation"),
    ],
)
def test_bad_pairs(client: httpx.Client, body: dict[str, Any], field: str) -> None:
    r = client.post("/v1/translate/score", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["field"] == field, r.json()
