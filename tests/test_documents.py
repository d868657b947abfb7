"""Documents for the translator: a paragraph split into sentences and rejoined with its own whitespace, HTML
with only its text nodes translated, the sentences batched together and counted as items.

The splitting and the HTML round trip are checked on their own (no model); the served path on a real
uvicorn server with the tiny translator: a paragraph's translation equals its sentences translated one by
one, joined with the paragraph's whitespace, and its sentences run as one batch (the batch-size metric).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import lxml.html
import pytest
from servers import LiveServer, metric

from service.pipelines.documents import document
from service.settings import Settings

SENTENCES = ["A man is walking.", "Two young children are playing in the sand.", "A dog runs!"]

# Real-world markup: nested inline tags, attributes, entities, <br>, a comment, a script and a
# translate="no" element.
HTML = (
    '<div class="post" id="p1"><h2 title="A title">A man is walking.</h2>'
    "<p>Two <em>young <b>children</b></em> are playing &amp; laughing.<br>A dog runs!"
    ' <a href="https://example.org/?a=1&amp;b=2" rel="nofollow">A red ball.</a></p>'
    "<!-- A comment. --><script>var s = 'A man is walking.';</script>"
    '<p><span translate="no">Brand Name</span> is&nbsp;here.</p></div>'
)


def tree(markup: str) -> list[Any]:
    """The tag tree without its text: (tag, attributes) per element, depth first (comments included)."""
    root = lxml.html.fragment_fromstring(markup, create_parent="div")
    return [(str(e.tag), sorted(e.attrib.items())) for e in root.iter()]


def texts(markup: str) -> list[str]:
    root = lxml.html.fragment_fromstring(markup, create_parent="div")
    return [t for e in root.iter() for t in (e.text, e.tail) if t]


# --- the documents themselves, no model -------------------------------------------------------


def test_plain_text_splits_and_keeps_its_whitespace() -> None:
    text = "  A man is walking.  Two young children are playing in the sand.\n\nA dog runs!\n"
    doc = document(text, "text")
    assert doc.sentences == SENTENCES
    assert doc.join(doc.sentences) == text
    assert doc.join(["1", "2", "3"]) == "  1  2\n\n3\n"
    assert document(text, "text", split=False).sentences == [text.strip()]
    assert document("Mr. Smith met Dr. Jones at 3 p.m. today. He left.", "text").sentences == [
        "Mr. Smith met Dr. Jones at 3 p.m. today.",
        "He left.",
    ]


def test_html_keeps_the_tree_and_translates_only_text_nodes() -> None:
    doc = document(HTML, "html")
    assert "var s" not in " ".join(doc.sentences)  # the script's text is not prose
    assert "Brand Name" not in doc.sentences and "A comment." not in doc.sentences
    assert "Two" in doc.sentences and "are playing & laughing." in doc.sentences  # entities decoded
    out = doc.join([s.upper() for s in doc.sentences])
    assert tree(out) == tree(HTML)
    assert "var s = 'A man is walking.';" in out and "<!-- A comment. -->" in out
    assert 'href="https://example.org/?a=1&amp;b=2"' in out and "<br>" in out
    assert "ARE PLAYING &amp; LAUGHING." in out and "Brand Name" in out
    changed = [(a, b) for a, b in zip(texts(HTML), texts(out), strict=True) if a != b]
    assert changed and all(b == a.upper() for a, b in changed)
    assert document("<p><br></p>", "html").sentences == []


def test_a_whole_html_document() -> None:
    page = "<!DOCTYPE html><html><head><title>A title.</title></head><body><p>A dog runs.</p></body></html>"
    doc = document(page, "html")
    assert doc.sentences == ["A title.", "A dog runs."]
    out = doc.join(["T", "D"])
    assert out.startswith("<!DOCTYPE html>") and "<title>T</title>" in out and "<p>D</p>" in out


# --- served -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def api(tiny_models: Path) -> Iterator[LiveServer]:
    # Length-sorted sub-batches off (BATCH_SPLIT_RATIO 0), so one batch taken is one model call.
    settings = Settings(MODEL_REPOSITORY=tiny_models, CACHE_ENABLED=False, MAX_ITEMS=8, BATCH_SPLIT_RATIO=0)
    with LiveServer(settings) as server:
        yield server


@pytest.fixture(scope="module")
def client(api: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api.url, timeout=120) as c:
        yield c


def translate(client: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    r = client.post("/v1/translate", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_paragraph_is_its_sentences_one_by_one(client: httpx.Client) -> None:
    paragraph = f"{SENTENCES[0]}  {SENTENCES[1]}\n{SENTENCES[2]}"
    alone = [translate(client, {"text": s, "return_scores": True})["results"][0] for s in SENTENCES]
    body = translate(client, {"text": paragraph, "return_scores": True})
    got = body["results"][0]
    assert got["sentences"] == 3
    assert got["text"] == f"{alone[0]['text']}  {alone[1]['text']}\n{alone[2]['text']}"
    assert got["score"] == pytest.approx(sum(a["score"] for a in alone) / 3, abs=1e-4)
    assert body["usage"]["output_tokens"] == sum(
        translate(client, {"text": s})["usage"]["output_tokens"] for s in SENTENCES
    )
    whole = translate(client, {"text": paragraph, "split_sentences": False})["results"][0]
    assert whole["sentences"] == 1


def test_beam_alternatives_of_a_paragraph(client: httpx.Client) -> None:
    beam = {"beam_size": 3, "num_return_sequences": 2}
    alone = [translate(client, {"text": s, **beam})["results"][0]["sequences"] for s in SENTENCES[:2]]
    got = translate(client, {"text": " ".join(SENTENCES[:2]), **beam})["results"][0]["sequences"]
    assert [s["text"] for s in got] == [f"{a['text']} {b['text']}" for a, b in zip(*alone, strict=True)]


def test_a_paragraph_runs_as_one_batch(api: LiveServer, client: httpx.Client) -> None:
    """Five sentences on an idle server: one model call of five items (not five calls of one)."""
    five = " ".join([*SENTENCES, "A woman sings.", "People."])
    calls = metric(api.url, "tserve_batch_size_count", model="translator")
    items = metric(api.url, "tserve_batch_size_sum", model="translator")
    assert translate(client, {"text": five})["results"][0]["sentences"] == 5
    assert metric(api.url, "tserve_batch_size_count", model="translator") - calls == 1
    assert metric(api.url, "tserve_batch_size_sum", model="translator") - items == 5


def test_html_served(client: httpx.Client) -> None:
    got = translate(client, {"text": HTML, "format": "html"})["results"][0]
    assert tree(got["text"]) == tree(HTML)
    assert "var s = 'A man is walking.';" in got["text"] and "Brand Name" in got["text"]
    heading = translate(client, {"text": "A man is walking."})["results"][0]["text"]
    assert lxml.html.fragment_fromstring(got["text"], create_parent="div").find(".//h2").text == heading
    nothing = translate(client, {"text": "<p><br></p>", "format": "html"})
    assert nothing["results"][0] == {**nothing["results"][0], "text": "<p><br></p>", "sentences": 0}


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"text": " ".join(["A dog runs."] * 9)}, "text", "9 sentences"),
        ({"texts": ["A dog runs. A cat sits.", " ".join(["A dog runs."] * 7)]}, "texts", "9 sentences"),
        ({"text": "A dog.", "format": "markdown"}, "format", "html"),
        ({"text": "a" * 4097}, "text", "4096"),
    ],
)
def test_document_limits(client: httpx.Client, body: dict[str, Any], field: str, words: str) -> None:
    r = client.post("/v1/translate", json=body)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["field"] == field and words in error["message"], error
