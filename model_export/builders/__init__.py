"""One builder per served model: `train_model(ctx) -> Trained`, then `graphs(trained, seed)` for export."""

from __future__ import annotations

from collections.abc import Callable

from . import bert, gpt, translator, vit
from .common import GraphSpec, Trained

Builder = tuple[Callable[..., Trained], Callable[[Trained, int], dict[str, GraphSpec]]]

BUILDERS: dict[str, Builder] = {
    "translator": (translator.train_model, translator.graphs),
    "bert-classifier": (bert.train_classifier, bert.graphs),
    "bert-qa": (bert.train_qa, bert.graphs),
    "bert-tagger": (bert.train_tagger, bert.graphs),
    "gpt": (gpt.train_model, gpt.graphs),
    "vit": (vit.train_model, vit.graphs),
}
