"""Entity grouping the caller chooses (``aggregation_strategy``, ``ignore_labels``), as transformers defines it.

The reference is transformers' own ``TokenClassificationPipeline`` on a small random-weight
``BertForTokenClassification`` over the tiny tagger's tokenizer and labels: the same logits go through the
service's ``aggregate``, and every strategy must give transformers' entities (labels, character spans,
scores). Then the served tagger: each strategy on the REST door and Hugging Face's format, the default
unchanged, and an unknown strategy a 422 naming the field.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from huggingface_hub import InferenceClient
from servers import LiveServer
from tokenizers import Tokenizer
from transformers import BertConfig, BertForTokenClassification, PreTrainedTokenizerFast, pipeline

from service.pipelines.entity_spans import STRATEGIES, Aggregation, aggregate
from service.settings import Settings

LABELS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
TEXTS = [
    "Ada Lovelace met Charles Babbage in London.",
    "The United Nations opened an office in Geneva, Switzerland, in 1946.",
]


@pytest.fixture(scope="module")
def reference(tiny_models: Path) -> tuple[Any, Tokenizer, Any]:
    path = tiny_models / "bert-tagger" / "tokenizer.json"
    tokenizer = Tokenizer.from_file(str(path))
    fast = PreTrainedTokenizerFast(tokenizer_file=str(path), unk_token="[UNK]", pad_token="[PAD]")
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        id2label=dict(enumerate(LABELS)),
        label2id={label: i for i, label in enumerate(LABELS)},
    )
    model = BertForTokenClassification(config).eval()
    with torch.no_grad():  # sharper, varied tags so that every grouping rule is exercised
        model.classifier.weight.mul_(40)
    return model, tokenizer, fast


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("ignore", [None, [], ["O", "PER", "B-PER"]])
def test_aggregate_equals_transformers_pipeline(
    reference: tuple[Any, Tokenizer, Any], strategy: str, ignore: list[str] | None
) -> None:
    model, tokenizer, fast = reference
    tagger = pipeline("token-classification", model=model, tokenizer=fast, aggregation_strategy=strategy)
    for text in TEXTS:
        kwargs = {} if ignore is None else {"ignore_labels": ignore}
        expected = tagger(text, **kwargs)
        encoding = tokenizer.encode(text)
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([encoding.ids])).logits[0].numpy()
        labels = ("O",) if ignore is None else tuple(ignore)
        got = aggregate(
            logits, list(encoding.word_ids), list(encoding.offsets), LABELS, Aggregation(strategy, labels)
        )
        key = "entity" if strategy == "none" else "entity_group"
        assert [(e.label, e.start, e.end) for e in got] == [(x[key], x["start"], x["end"]) for x in expected]
        np.testing.assert_allclose([e.score for e in got], [float(x["score"]) for x in expected], rtol=1e-5)
        assert expected or ignore == ["O", "PER", "B-PER"]  # the random tagger finds something to group


@pytest.fixture(scope="module")
def api(tiny_models: Path) -> Iterator[LiveServer]:
    with LiveServer(Settings(MODEL_REPOSITORY=tiny_models, MAX_QUEUE_DELAY_MS=20)) as server:
        yield server


def entities(api: LiveServer, **options: Any) -> Any:
    body = {"task": "entities", "texts": TEXTS, "cache": False, **options}
    answer = httpx.post(f"{api.url}/v1/extract", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    return [r["entities"] for r in answer.json()["results"]]


def test_served_tagger_takes_every_strategy(api: LiveServer) -> None:
    default = entities(api)
    assert entities(api, aggregation_strategy="first") == default  # the house tagger's own: unchanged
    tokens = entities(api, aggregation_strategy="none", ignore_labels=[])
    assert all(e["label"] in LABELS for row in tokens for e in row) and all(tokens)
    for strategy in ("simple", "average", "max"):
        for text, row in zip(TEXTS, entities(api, aggregation_strategy=strategy), strict=True):
            for e in row:
                assert text[e["start"] : e["end"]] == e["text"] and e["label"] != "O"
    kept = entities(api, aggregation_strategy="first", ignore_labels=[])  # "O" groups too
    assert sum(map(len, kept)) >= sum(map(len, default))

    client = InferenceClient(base_url=f"{api.url}/models/bert-tagger")
    got = client.token_classification(TEXTS[0], aggregation_strategy="none", ignore_labels=[])
    assert [(g.entity, g.start, g.end) for g in got] == [
        (e["label"], e["start"], e["end"]) for e in tokens[0]
    ]

    unknown = httpx.post(
        f"{api.url}/v1/extract", json={"task": "entities", "text": "a", "aggregation_strategy": "mean"}
    )
    assert unknown.status_code == 422 and unknown.json()["error"]["field"] == "aggregation_strategy"
    hf = httpx.post(
        f"{api.url}/models/bert-tagger", json={"inputs": "a", "parameters": {"aggregation_strategy": "mean"}}
    )
    assert hf.status_code == 422 and hf.json()["error"].startswith("parameters.aggregation_strategy:")
    qa = httpx.post(
        f"{api.url}/v1/extract",
        json={"task": "qa", "question": "q?", "context": "c.", "aggregation_strategy": "simple"},
    )
    assert qa.status_code == 422 and qa.json()["error"]["field"] == "aggregation_strategy"
