"""One builder per served model: `prepare(ctx) -> TrainingJob` (run it to get a `Trained`), then `graphs(trained, seed)`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import bert, gpt, translator, vit
from .common import BuildContext, GraphSpec, Trained, TrainingJob

Builder = tuple[Callable[[BuildContext[Any]], TrainingJob], Callable[[Trained, int], dict[str, GraphSpec]]]

BUILDERS: dict[str, Builder] = {
    "translator": (translator.prepare, translator.graphs),
    "bert-classifier": (bert.prepare_classifier, bert.graphs),
    "bert-qa": (bert.prepare_qa, bert.graphs),
    "bert-tagger": (bert.prepare_tagger, bert.graphs),
    "bert-embedder": (bert.prepare_embedder, bert.graphs),
    "gpt": (gpt.prepare, gpt.graphs),
    "vit": (vit.prepare, vit.graphs),
}
