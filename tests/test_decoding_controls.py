"""CTranslate2's decoding controls inside the translator's greedy and beam search: in process on the tiny
translator's ONNX files (token for token, number for number), and through POST /v1/translate on a real
server. A forced row shares its batch with free rows, which must decode exactly as they do alone."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from parity import check_close
from servers import LiveServer
from tokenizers import Tokenizer

from service.engine.repository import load_model
from service.engine.runtime import RuntimeOptions
from service.engine.seq2seq import FREE, RowControls, Seq2SeqModel
from service.pipelines.translate import prepare_source
from service.settings import Settings

SOURCES = ["A man is walking.", "Two young children are playing in the sand.", "A dog runs."]
PREFIX = "Ein Mann"


@pytest.fixture(scope="module")
def engine(tiny_models: Path) -> tuple[Seq2SeqModel, Tokenizer, list[list[int]]]:
    model = load_model(tiny_models / "translator", RuntimeOptions(device="cpu"))
    assert model.tokenizer is not None
    seq2seq = Seq2SeqModel(model.graphs["encoder"], model.graphs["decoder"], model.manifest)
    sources = [prepare_source(model.manifest, model.tokenizer.encode(s).ids, 48)[0] for s in SOURCES]
    return seq2seq, model.tokenizer, sources


def ids(tokenizer: Tokenizer, text: str) -> tuple[int, ...]:
    return tuple(tokenizer.encode(text, add_special_tokens=False).ids)


def test_a_forced_prefix_in_a_batch_changes_no_other_row(engine: Any) -> None:
    seq2seq, tokenizer, sources = engine
    prefix = ids(tokenizer, PREFIX)
    forced = RowControls(prefix=prefix)
    batch = seq2seq.greedy(sources, 24, [FREE, forced, FREE])
    alone = [seq2seq.greedy([s], 24)[0] for s in sources]
    assert tuple(batch[1].tokens[: len(prefix)]) == prefix  # the prefix, token for token
    for i in (0, 2):
        assert batch[i].tokens == alone[i].tokens
    check_close(
        [batch[0].logprob, batch[2].logprob],
        [alone[0].logprob, alone[2].logprob],
        atol=1e-4,
        rtol=0,
        name_a="beside a forced row",
        name_b="alone",
    )
    # beam search: the forced request's every hypothesis starts with the prefix; the free one is as alone
    beams = seq2seq.beam_search(sources[:2], 3, 24, 1.0, 3, [FREE, forced])
    assert all(tuple(h.tokens[: len(prefix)]) == prefix for h in beams[1])
    assert [h.tokens for h in beams[0]] == [
        h.tokens for h in seq2seq.beam_search(sources[:1], 3, 24, 1.0, 3)[0]
    ]


def test_rows_of_their_own_limits_share_a_call(engine: Any) -> None:
    """Greedy rows leave at their own step limits: in one call, each as alone with its limit."""
    seq2seq, _, sources = engine
    limits = [5, 24, 11]
    together = seq2seq.greedy(sources, limits)
    for source, limit, got in zip(sources, limits, together, strict=True):
        alone = seq2seq.greedy([source], limit)[0]
        assert got.tokens == alone.tokens and len(got.tokens) <= limit
        check_close([got.logprob], [alone.logprob], atol=1e-4, rtol=0, name_a="together", name_b="alone")


def test_repetition_controls(engine: Any) -> None:
    seq2seq, _, sources = engine
    free = seq2seq.greedy(sources, 24)
    assert any(len(set(h.tokens)) < len(h.tokens) for h in free)  # the tiny model repeats itself
    unique = seq2seq.greedy(sources, 24, [RowControls(no_repeat_ngram_size=1)] * 3)
    assert all(len(set(h.tokens)) == len(h.tokens) for h in unique)
    bigrams = seq2seq.greedy(sources, 24, [RowControls(no_repeat_ngram_size=2)] * 3)
    for h in bigrams:
        pairs = list(zip(h.tokens, h.tokens[1:], strict=False))
        assert len(set(pairs)) == len(pairs)
    penalised = seq2seq.greedy(sources, 24, [RowControls(repetition_penalty=10.0)] * 3)
    repeats = [len(h.tokens) - len(set(h.tokens)) for h in (*free, *penalised)]
    assert sum(repeats[3:]) < sum(repeats[:3])
    banned = free[0].tokens[0]
    suppressed = seq2seq.greedy(sources, 24, [RowControls(suppress_sequences=((banned,),))] * 3)
    assert all(banned not in h.tokens for h in suppressed)
    two = tuple(free[0].tokens[:2])
    after = seq2seq.greedy(sources[:1], 24, [RowControls(suppress_sequences=(two,))])[0]
    assert all(tuple(after.tokens[i : i + 2]) != two for i in range(len(after.tokens)))


def test_min_length_and_penalty_recomputed(engine: Any) -> None:
    """The step's scores against a recomputation on chosen logits (the tiny model rarely ends early)."""
    seq2seq, _, _ = engine
    vocab, eos = 600, seq2seq.eos_id
    logits = np.zeros((2, vocab))
    logits[:, eos], logits[:, 7], logits[:, 8] = 10.0, 2.0, -1.0
    rows = [RowControls(min_length=3), RowControls(min_length=3, repetition_penalty=2.0)]
    lp = seq2seq._scores(logits.copy(), [[7, 8], [7, 8, 9]], rows)
    assert lp[0, eos] == -np.inf and lp[0].argmax() == 7  # 2 tokens < 3: no </s> yet
    expected = logits[1].copy()
    expected[7], expected[8] = 2.0 / 2.0, -1.0 * 2.0  # CTRL: / p when positive, x p when not
    expected -= np.log(np.exp(expected - expected.max()).sum()) + expected.max()
    suppressed = seq2seq.suppressed
    expected[suppressed] = -np.inf
    np.testing.assert_allclose(lp[1], expected, atol=1e-12)


def test_alternatives_branch_after_the_prefix(engine: Any) -> None:
    seq2seq, tokenizer, sources = engine
    prefix = ids(tokenizer, PREFIX)
    picks = [RowControls(prefix=prefix, pick=j) for j in range(3)]
    alternatives = seq2seq.greedy([sources[0]] * 3, 24, picks)
    assert all(tuple(h.tokens[: len(prefix)]) == prefix for h in alternatives)
    branch = [h.tokens[len(prefix)] for h in alternatives]
    assert len(set(branch)) == 3  # the three most likely tokens after the prefix
    assert alternatives[0].tokens == seq2seq.greedy([sources[0]], 24, [RowControls(prefix=prefix)])[0].tokens


# --- through POST /v1/translate ----------------------------------------------------------------


@pytest.fixture(scope="module")
def client(tiny_models: Path) -> Iterator[httpx.Client]:
    settings = Settings(MODEL_REPOSITORY=tiny_models, SERVED_MODELS=["translator"], CACHE_ENABLED=False)
    with LiveServer(settings) as server, httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


def translate(client: httpx.Client, **body: Any) -> list[dict[str, Any]]:
    r = client.post("/v1/translate", json={"return_scores": True, **body})
    assert r.status_code == 200, r.text
    return list(r.json()["results"])


def test_served_prefix_and_alternatives(client: httpx.Client) -> None:
    got = translate(client, texts=SOURCES[:2], target_prefix=[PREFIX, None])
    alone = translate(client, text=SOURCES[1])[0]
    assert got[0]["text"].startswith(PREFIX)
    assert (got[1]["text"], got[1]["finish_reason"]) == (alone["text"], alone["finish_reason"])
    check_close([got[1]["score"]], [alone["score"]], atol=1e-4, rtol=0, name_a="beside", name_b="alone")
    every = translate(client, texts=SOURCES[:2], target_prefix=PREFIX)
    assert all(r["text"].startswith(PREFIX) for r in every)
    alt = translate(
        client, text=SOURCES[0], target_prefix=PREFIX, return_alternatives=True, num_hypotheses=3
    )[0]
    assert len(alt["sequences"]) == 3 and all(s["text"].startswith(PREFIX) for s in alt["sequences"])
    assert alt["text"] == got[0]["text"]
    assert len({s["text"] for s in alt["sequences"]}) == 3
    nbest = translate(client, text=SOURCES[0], beam_size=3, num_hypotheses=2)[0]
    assert (
        nbest["sequences"]
        == translate(client, text=SOURCES[0], beam_size=3, num_return_sequences=2)[0]["sequences"]
    )
    assert translate(client, text=SOURCES[2], max_decoding_length=5) == translate(
        client, text=SOURCES[2], max_new_tokens=5
    )
    capped = translate(
        client, text=SOURCES[2], no_repeat_ngram_size=1, repetition_penalty=1.5, min_decoding_length=4
    )
    assert capped[0]["text"] and capped[0]["score"] <= 0


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"texts": SOURCES[:2], "target_prefix": [PREFIX]}, "target_prefix"),
        ({"text": SOURCES[0], "target_prefix": "Ein " * 40, "max_new_tokens": 8}, "target_prefix"),
        ({"text": SOURCES[0], "max_new_tokens": 8, "max_decoding_length": 9}, "max_decoding_length"),
        ({"text": SOURCES[0], "repetition_penalty": 0}, "repetition_penalty"),
        ({"text": SOURCES[0], "no_repeat_ngram_size": -1}, "no_repeat_ngram_size"),
        ({"text": SOURCES[0], "return_alternatives": True, "num_hypotheses": 9}, "num_hypotheses"),
        ({"text": SOURCES[0], "suppress_sequences": [""]}, "suppress_sequences[0]"),
    ],
)
def test_bad_controls(client: httpx.Client, body: dict[str, Any], field: str) -> None:
    r = client.post("/v1/translate", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["field"] == field, r.json()
