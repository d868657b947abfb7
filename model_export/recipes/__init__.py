"""One recipe per served model: `prepare(ctx) -> TrainingJob` (run it to get a `Trained`), then `graphs(trained, seed)`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from ..onnx_export import GraphSpec
from . import bert, gpt, reranker, translator, vit
from .common import BuildContext, Trained, TrainingJob


class ModelRecipe(NamedTuple):
    prepare: Callable[[BuildContext[Any]], TrainingJob]
    graphs: Callable[[Trained, int], dict[str, GraphSpec]]


RECIPES: dict[str, ModelRecipe] = {
    "translator": ModelRecipe(translator.prepare, translator.graphs),
    "bert-classifier": ModelRecipe(bert.prepare_classifier, bert.graphs),
    "bert-qa": ModelRecipe(bert.prepare_qa, bert.graphs),
    "bert-tagger": ModelRecipe(bert.prepare_tagger, bert.graphs),
    "bert-embedder": ModelRecipe(bert.prepare_embedder, bert.graphs),
    "bert-reranker": ModelRecipe(reranker.prepare_reranker, bert.graphs),
    "gpt": ModelRecipe(gpt.prepare, gpt.graphs),
    "vit": ModelRecipe(vit.prepare, vit.graphs),
}
