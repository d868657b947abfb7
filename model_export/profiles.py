"""Build profiles: `tiny` builds every model in seconds for tests, `default` is what the quickstart serves.

A profile is one typed recipe per model: the architecture (the model's own
config; its `vocab_size` is what the tokenizer is trained towards, and the
builder puts in the size it reached), how much data, and the training
schedule (a `TrainSpec`). Every model trains for a fixed number of optimizer
steps (the CLI's `--steps` and `--steps-scale` override them), with its
learning-rate schedule tied to those steps, so any machine builds the same
model; a slower one only takes longer. The default budgets share out one hour
of the slow CPU class (a 2-core AVX2-only EPYC), the variants stage included,
by where each model's validation curve is steepest (docs/EXPORT.md, "The
default build"; the curves measured there are quoted beside each budget).

`reference_step_s` is one warm-up step, `reference_other_s` export plus the
probes, and `reference_variants_s` the variants stage (with the evaluations; fused is no longer evaluated where
int8 serves, 2026-11-26: those figures scaled by the share its pass took in that day's clean build),
on the reference machine (a 2-core AMD EPYC with PyTorch held to AVX2 kernels;
the variants stage, with int8's evaluations, measured in the clean build of docs/EXPORT.md's quality table
on another EPYC and converted by its warm-up ratio): the build estimate scales
the latter two by how this machine's warm-up compares with the first. They inform the estimate only; they never
change what is trained.

Data sizes (`train_pairs`, `train_examples`, `train_chars`, `eval_limit`) of
None mean the whole split.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TypeVar

from .models.bert import BertConfig
from .models.gpt import GPTConfig
from .models.translator import TranslatorConfig
from .models.vit import ViTConfig
from .training import TrainSpec

R = TypeVar("R", bound="Recipe")

MODEL_NAMES = [
    "translator",
    "bert-classifier",
    "bert-qa",
    "bert-tagger",
    "bert-embedder",
    "bert-reranker",
    "gpt",
    "vit",
]


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """What every served model's recipe has: its schedule, what the build evaluates, the reference timings."""

    train: TrainSpec
    eval_limit: int | None = None  # validation examples the build scores (characters for gpt)
    # The validation metric measured during training (training.Probe): at this many evenly spaced
    # steps, on the first `probe_limit` validation examples (None: as many as `eval_limit`). Probes
    # are outside the step budget but inside the build's hour: a few seconds each at these sizes.
    probe_points: int = 4
    probe_limit: int | None = None
    reference_step_s: float | None = None
    reference_other_s: float = 0.0
    reference_variants_s: float = 0.0

    def with_steps(self, steps: int) -> Recipe:
        """The same recipe for `steps` optimizer steps; its warmup is capped at a fifth of them."""
        warmup = max(1, min(self.train.warmup_steps, steps // 5))
        return dataclasses.replace(
            self, train=dataclasses.replace(self.train, steps=steps, warmup_steps=warmup)
        )


@dataclass(frozen=True, kw_only=True)
class TranslatorRecipe(Recipe):
    model: TranslatorConfig
    train_pairs: int | None
    batch_tokens: int  # padded tokens per side of a batch
    label_smoothing: float
    beam_size: int  # what the build's evaluation decodes with


@dataclass(frozen=True, kw_only=True)
class BertPretraining:
    """The BERT encoder pretrained here with masked-LM: used only when no checkpoint is available."""

    model: BertConfig
    train: TrainSpec
    batch_size: int
    seq_len: int


@dataclass(frozen=True, kw_only=True)
class BertHeadRecipe(Recipe):
    """A fine-tuned head (classifier, tagger) on the shared encoder."""

    pretraining: BertPretraining
    dropout: float
    max_len: int
    train_examples: int | None
    batch_size: int


@dataclass(frozen=True, kw_only=True)
class BertEmbedderRecipe(Recipe):
    """Sentence embeddings: the shared encoder with mean pooling, trained no further (`train.steps` is 0).

    With the checkpoint the encoder is all-MiniLM-L6-v2, already a sentence encoder; without it, the
    masked-LM encoder of `pretraining` as it is (no sentence-level objective here).
    """

    pretraining: BertPretraining
    max_len: int  # tokens per text, [CLS] and [SEP] included (sentence-transformers' max_seq_length)


@dataclass(frozen=True, kw_only=True)
class BertRerankerRecipe(BertHeadRecipe):
    """The cross-encoder (``recipes/reranker.py``): ``batch_size`` questions a step, each with its own
    paragraph and ``negatives`` others of its article; measured re-ordering BM25's first ``candidates``."""

    negatives: int
    candidates: int
    frozen_layers: int = 0  # the encoder's first layers (and its embeddings) kept as the checkpoint has them


NO_TRAINING = TrainSpec(steps=0, lr=0.0, warmup_steps=0)


@dataclass(frozen=True, kw_only=True)
class BertQaRecipe(BertHeadRecipe):
    """The QA span head: serving windows of `max_len` by `stride`, shorter training windows."""

    stride: int
    max_question_len: int
    max_answer_len: int
    train_max_len: int
    train_stride: int
    negative_fraction: float  # answer-less training windows kept


@dataclass(frozen=True, kw_only=True)
class GptRecipe(Recipe):
    model: GPTConfig
    seq_len: int
    train_chars: int | None
    batch_size: int


@dataclass(frozen=True, kw_only=True)
class VitRecipe(Recipe):
    model: ViTConfig
    train_examples: int | None
    batch_size: int
    hflip: bool
    crop_padding: int  # random crops of the image padded by this many pixels (0: none)
    label_smoothing: float


# The default profile, what the quickstart serves.

# Used only when no checkpoint is available: BERT pretrained from scratch with masked-LM.
_DEFAULT_BERT = BertPretraining(
    model=BertConfig(
        vocab_size=16000,
        hidden_size=256,
        num_layers=4,
        num_heads=4,
        intermediate_size=1024,
        max_position=512,
        dropout=0.0,
    ),
    train=TrainSpec(steps=800, lr=5e-4, warmup_steps=200),
    batch_size=64,
    seq_len=128,
)

_TRANSLATOR = TranslatorRecipe(
    model=TranslatorConfig(
        vocab_size=8000,
        d_model=256,
        num_heads=4,
        d_ff=1024,
        encoder_layers=3,
        decoder_layers=3,
        dropout=0.0,
        max_len=256,
    ),
    train_pairs=None,
    # small batches, many steps: more updates pay at this budget
    batch_tokens=500,
    label_smoothing=0.1,
    train=TrainSpec(steps=2000, lr=0.001, warmup_steps=200, weight_decay=0.01),
    beam_size=4,
    probe_limit=200,
    # derived from the 2,000-token step's time
    reference_step_s=0.167,
    reference_other_s=28,
    reference_variants_s=105,
)

_BERT_CLASSIFIER = BertHeadRecipe(
    pretraining=_DEFAULT_BERT,
    # dropout as the checkpoint was trained (with twice the rate and layer-wise decay: they pay together)
    dropout=0.1,
    max_len=64,
    train_examples=None,
    batch_size=32,
    # its curve is flat past 250 steps, so more steps buy little
    train=TrainSpec(steps=350, lr=2e-4, warmup_steps=30, weight_decay=0.01, layer_decay=0.8),
    reference_step_s=0.254,  # 0.268 with the per-tensor AdamW: fused 0.947x, side by side
    reference_other_s=24,
    reference_variants_s=11,
)

_BERT_QA = BertQaRecipe(
    pretraining=_DEFAULT_BERT,
    dropout=0.0,
    max_len=256,
    stride=128,
    max_question_len=64,
    max_answer_len=30,
    train_max_len=128,
    train_stride=64,
    negative_fraction=0.1,
    train_examples=None,
    batch_size=8,
    # twice the rate learns faster in the steps the hour holds; 600 steps would reach the target
    train=TrainSpec(steps=400, lr=2e-4, warmup_steps=30, weight_decay=0.01),
    probe_limit=150,
    reference_step_s=0.402,  # 0.41 with the per-tensor AdamW: fused 0.981x, side by side
    reference_other_s=37,
    reference_variants_s=97,
)

_BERT_TAGGER = BertHeadRecipe(
    pretraining=_DEFAULT_BERT,
    dropout=0.0,
    max_len=128,
    train_examples=None,
    # half the sentences a batch, twice the steps: more updates pay
    batch_size=16,
    # rare entity types need steps; twice the rate alone pays, as on QA
    train=TrainSpec(steps=900, lr=2e-4, warmup_steps=30, weight_decay=0.01),
    probe_limit=500,
    reference_step_s=0.171,  # the 32-sentence step's 0.375 by the side-by-side ratios (0.49x; fused AdamW 0.93x)
    reference_other_s=18,
    reference_variants_s=30,
)

_BERT_EMBEDDER = BertEmbedderRecipe(
    pretraining=_DEFAULT_BERT,
    max_len=256,  # all-MiniLM-L6-v2's max_seq_length: it was trained on pieces up to 256 tokens
    train=NO_TRAINING,
    reference_other_s=6,
    reference_variants_s=20,
)

_BERT_RERANKER = BertRerankerRecipe(
    pretraining=_DEFAULT_BERT,
    dropout=0.1,
    max_len=256,  # a SQuAD paragraph with its question: 90% fit whole (the median is 189 tokens)
    train_examples=None,
    batch_size=4,
    negatives=3,
    candidates=10,
    frozen_layers=3,
    # flat from 30 steps (MRR@10 on the 60 probe questions 0.897 at 30, 0.896 at 50, 60 and 100): the
    # heads start from the encoder's similarity and the words the pair shares, and steps add little
    train=TrainSpec(steps=30, lr=4e-5, warmup_steps=6, weight_decay=0.01),
    eval_limit=200,  # 2,000 pairs through ONNX Runtime: about 110 s an evaluation
    probe_points=1,  # a probe re-orders 600 pairs: 45 s, more than 15 training steps
    probe_limit=60,
    # this recipe's own build on a 2-core AVX2 EPYC (2026-12-06: a warm-up step 2.84 s, train, probe and
    # export 190 s, evaluation 127 s, variants with int8's evaluation 213 s), converted by that machine's
    # warm-up ratio to the reference over the BERT heads (0.92x)
    reference_step_s=2.6,
    reference_other_s=213,
    reference_variants_s=196,
)
_GPT = GptRecipe(
    # dropout: several epochs fit the budget; 192 wide: at the same compute it sees more text
    model=GPTConfig(
        vocab_size=2048, d_model=192, num_layers=4, num_heads=4, d_ff=768, max_len=256, dropout=0.1
    ),
    seq_len=256,  # the whole served context: every learned position is trained
    train_chars=None,
    # half the rows, twice the steps: more updates pay at this budget
    batch_size=4,
    train=TrainSpec(steps=700, lr=0.002, warmup_steps=50, weight_decay=0.1),
    probe_limit=20_000,
    reference_step_s=0.186,  # the 8-row step's 0.368 by the side-by-side ratios (0.51x; fused AdamW 0.987x)
    reference_other_s=9,
    reference_variants_s=14,
)

_VIT = VitRecipe(
    model=ViTConfig(patch_size=7, d_model=128, num_layers=4, num_heads=4, d_ff=256, dropout=0.0),
    train_examples=None,
    batch_size=128,
    # a few epochs only: augmentation slows learning more than it regularises
    hflip=False,
    crop_padding=0,
    label_smoothing=0.0,
    train=TrainSpec(steps=900, lr=2e-3, warmup_steps=100, weight_decay=0.05),
    reference_step_s=0.079,  # 0.082 with the per-tensor AdamW: fused 0.966x, side by side
    reference_other_s=9,
    reference_variants_s=5,
)

DEFAULT: dict[str, Recipe] = {
    "translator": _TRANSLATOR,
    "bert-classifier": _BERT_CLASSIFIER,
    "bert-qa": _BERT_QA,
    "bert-tagger": _BERT_TAGGER,
    "bert-embedder": _BERT_EMBEDDER,
    "bert-reranker": _BERT_RERANKER,
    "gpt": _GPT,
    "vit": _VIT,
}


def _tiny(default: R, **changes: Any) -> R:
    """``default`` with ``changes``, and no reference timings: those describe the default build."""
    return dataclasses.replace(
        default,
        reference_step_s=None,
        reference_other_s=0.0,
        reference_variants_s=0.0,
        probe_points=2,
        probe_limit=None,
        **changes,
    )


# The tiny profile: every model in seconds, for tests. It states only what differs from the default.
_TINY_BERT = dataclasses.replace(
    _DEFAULT_BERT,
    model=dataclasses.replace(
        _DEFAULT_BERT.model,
        vocab_size=800,
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        intermediate_size=64,
        max_position=128,
    ),
    # The default's 200 warmup steps outlast these 30: the tiny build has always trained so, and
    # its weights depend on it.
    train=dataclasses.replace(_DEFAULT_BERT.train, steps=30, lr=2e-3),
    batch_size=32,
    seq_len=48,
)
_TINY_FINE_TUNING = TrainSpec(steps=30, lr=2e-3, warmup_steps=5, weight_decay=0.01)

TINY: dict[str, Recipe] = {
    "translator": _tiny(
        _TRANSLATOR,
        model=dataclasses.replace(
            _TRANSLATOR.model,
            vocab_size=600,
            d_model=32,
            num_heads=2,
            d_ff=64,
            encoder_layers=2,
            decoder_layers=2,
            max_len=64,
        ),
        train_pairs=2000,
        batch_tokens=600,
        train=dataclasses.replace(_TRANSLATOR.train, steps=40, lr=3e-3, warmup_steps=5),
        eval_limit=32,
        beam_size=1,
    ),
    "bert-classifier": _tiny(
        _BERT_CLASSIFIER,
        pretraining=_TINY_BERT,
        dropout=0.0,
        max_len=48,
        train_examples=2000,
        train=_TINY_FINE_TUNING,
        eval_limit=64,
    ),
    "bert-qa": _tiny(
        _BERT_QA,
        pretraining=_TINY_BERT,
        max_len=96,
        stride=32,
        max_question_len=24,
        train_max_len=64,
        train_stride=16,
        train_examples=400,
        batch_size=16,
        train=dataclasses.replace(_TINY_FINE_TUNING, steps=20),
        eval_limit=24,
    ),
    "bert-tagger": _tiny(
        _BERT_TAGGER,
        pretraining=_TINY_BERT,
        max_len=64,
        train_examples=1000,
        batch_size=32,  # the tiny build's weights stay as they were
        train=_TINY_FINE_TUNING,
        eval_limit=64,
    ),
    "bert-embedder": _tiny(_BERT_EMBEDDER, pretraining=_TINY_BERT, max_len=64, eval_limit=128),
    "bert-reranker": _tiny(
        _BERT_RERANKER,
        pretraining=_TINY_BERT,
        dropout=0.0,
        max_len=96,
        train_examples=400,
        batch_size=8,
        negatives=3,
        candidates=8,
        train=dataclasses.replace(_TINY_FINE_TUNING, steps=20),
        eval_limit=16,
    ),
    "gpt": _tiny(
        _GPT,
        model=dataclasses.replace(
            _GPT.model,
            vocab_size=400,
            d_model=32,
            num_layers=2,
            num_heads=2,
            d_ff=64,
            max_len=64,
            dropout=0.0,
        ),
        seq_len=64,
        train_chars=60_000,
        batch_size=16,
        train=dataclasses.replace(_GPT.train, steps=40, lr=3e-3, warmup_steps=5),
        eval_limit=4000,
    ),
    "vit": _tiny(
        _VIT,
        model=dataclasses.replace(_VIT.model, d_model=32, num_layers=2, num_heads=2, d_ff=64),
        train_examples=2000,
        batch_size=64,
        train=dataclasses.replace(_VIT.train, steps=30, lr=3e-3, warmup_steps=5),
        eval_limit=256,
    ),
}

PROFILES: dict[str, dict[str, Recipe]] = {"tiny": TINY, "default": DEFAULT}


def recipe_for(profile: str, model: str) -> Recipe:
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}: choose one of {sorted(PROFILES)}")
    return PROFILES[profile][model]
