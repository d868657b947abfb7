"""Documents for the translator: a text of several sentences, or HTML, as the sentences it translates, and
the translations put back in the document's place.

The model was trained on single sentences, so a paragraph is split into sentences (``sentencex``, chosen
by measurement: benchmarks/RESULTS.md, "Documents") and every line break and run of whitespace between
them is kept as the client sent it. HTML is parsed with lxml's HTML parser; only text nodes are
translated (each split into sentences as plain text is), so tags, attributes, comments, entities' places
and the tree's structure come back as they were. The text of ``<script>``, ``<style>``, ``<code>``,
``<pre>``, ``<textarea>`` and of any element marked ``translate="no"`` (HTML's own attribute) or
``class="notranslate"`` (Google's and LibreTranslate's convention) is left as it is.

A ``Document`` is its sentences plus the way back: ``join`` takes one translation per sentence, in order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import lxml.etree
import lxml.html
import sentencex

from service.errors import InvalidInputError

TextFormat = Literal["text", "html"]

# Elements whose text is code or preformatted, never prose.
_UNTRANSLATED = frozenset(
    {"script", "style", "code", "pre", "textarea", "noscript", "template", "kbd", "samp"}
)


@dataclass(frozen=True)
class Document:
    sentences: list[str]
    _join: Callable[[Sequence[str]], str]

    def join(self, translations: Sequence[str]) -> str:
        assert len(translations) == len(self.sentences), "one translation per sentence"
        return self._join(translations)


# A plain text's template: a str is kept as is; None is the next sentence's translation.
_Piece = str | None


def _pieces(text: str, split: bool) -> tuple[list[_Piece], list[str]]:
    """The text as kept whitespace and sentence slots, and its sentences (stripped, never blank)."""
    pieces: list[_Piece] = []
    sentences: list[str] = []

    def add(chunk: str) -> None:
        core = chunk.strip()
        if not core:
            pieces.append(chunk)
            return
        start = chunk.index(core[0])
        lead, trail = chunk[:start], chunk[start + len(core) :]
        if lead:
            pieces.append(lead)
        pieces.append(None)
        sentences.append(core)
        if trail:
            pieces.append(trail)

    if not split:
        add(text)
        return pieces, sentences
    for line in text.splitlines(keepends=True):  # a line break always ends a sentence
        segments = list(sentencex.segment("en", line))
        for chunk in segments if "".join(segments) == line else [line]:
            add(chunk)
    return pieces, sentences


def _filled(pieces: Sequence[_Piece], translations: Sequence[str]) -> str:
    out, it = [], iter(translations)
    for piece in pieces:
        out.append(next(it) if piece is None else piece)
    return "".join(out)


def plain(text: str, split: bool = True) -> Document:
    pieces, sentences = _pieces(text, split)
    return Document(sentences, lambda translations: _filled(pieces, translations))


def _skipped(element: lxml.html.HtmlElement) -> bool:
    if not isinstance(element.tag, str):  # comments, processing instructions: their own text is not prose
        return True
    if element.tag.lower() in _UNTRANSLATED or element.get("translate", "").lower() == "no":
        return True
    return "notranslate" in element.get("class", "").split()


def _translatable(element: lxml.html.HtmlElement) -> bool:
    """Whether the text inside ``element`` (its ``text``) is translated: no ancestor or itself skipped."""
    node: lxml.html.HtmlElement | None = element
    while node is not None:
        if _skipped(node):
            return False
        node = node.getparent()
    return True


def _is_document(text: str) -> bool:
    head = text.lstrip()[:15].lower()
    return head.startswith("<!doctype") or head.startswith("<html")


def html(text: str, split: bool = True) -> Document:
    """``text`` as HTML: a fragment (the usual case: a paragraph's markup) or a whole document."""
    try:
        if _is_document(text):
            root = lxml.html.document_fromstring(text)
        else:
            root = lxml.html.fragment_fromstring(text, create_parent="div")
    except (lxml.etree.ParserError, ValueError) as exc:
        raise InvalidInputError(f"not parseable as HTML: {exc}", "inputs", "invalid_html") from exc
    # the document's own doctype (libxml2 reports its default HTML 4 one for a document without)
    doctype = root.getroottree().docinfo.doctype if text.lstrip()[:9].lower() == "<!doctype" else ""
    # (element, "text" | "tail", its template): every text node with something to translate
    slots: list[tuple[lxml.html.HtmlElement, str, list[_Piece]]] = []
    sentences: list[str] = []
    for element in root.iter():
        for attribute, inside in (("text", True), ("tail", False)):
            value = getattr(element, attribute)
            if not value or not value.strip() or (element is root and not inside):
                continue
            owner = element if inside else element.getparent()
            if owner is None or not _translatable(owner):
                continue
            pieces, found = _pieces(value, split)
            slots.append((element, attribute, pieces))
            sentences.extend(found)

    def join(translations: Sequence[str]) -> str:
        at = 0
        for element, attribute, pieces in slots:
            n = sum(p is None for p in pieces)
            setattr(element, attribute, _filled(pieces, translations[at : at + n]))
            at += n
        if _is_document(text):
            return str(lxml.html.tostring(root, encoding="unicode", doctype=doctype or None))
        inner = [root.text or "", *(lxml.html.tostring(child, encoding="unicode") for child in root)]
        return "".join(inner)

    return Document(sentences, join)


def document(text: str, text_format: TextFormat, split: bool = True) -> Document:
    return html(text, split) if text_format == "html" else plain(text, split)
