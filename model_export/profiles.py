"""Build profiles: `tiny` builds every model in seconds for tests, `default` is what the quickstart serves.

Every model trains for a fixed number of optimizer `steps` (the CLI's
`--steps` and `--steps-scale` override them), with its learning-rate
schedule tied to those steps, so any machine builds the same model; a slower
one only takes longer. The default budgets were calibrated so that a default
build meets every validation target with margin, and finishes within an hour
on a 2-core AVX2-only CPU (README, "Model quality").

`reference_step_s` and `reference_other_s` are what one step, and export plus
evaluation, took in the README's clean build (2-core AMD EPYC with PyTorch held
to AVX2 kernels): the build estimate scales the latter by how this machine's
measured warm-up compares with the former. They inform the estimate only; they
never change what is trained.
"""

from __future__ import annotations

from typing import Any

MODEL_NAMES = ["translator", "bert-classifier", "bert-qa", "bert-tagger", "gpt", "vit"]

PROFILES: dict[str, dict[str, dict[str, Any]]] = {
    "tiny": {
        "translator": dict(
            dropout=0.0,
            vocab_size=600,
            d_model=32,
            num_heads=2,
            d_ff=64,
            encoder_layers=2,
            decoder_layers=2,
            max_len=64,
            train_pairs=2000,
            batch_tokens=600,
            steps=40,
            lr=3e-3,
            warmup_steps=5,
            label_smoothing=0.1,
            eval_examples=32,
            beam_size=1,
        ),
        "bert": dict(
            dropout=0.0,
            vocab_size=800,
            hidden_size=32,
            num_layers=2,
            num_heads=2,
            intermediate_size=64,
            max_position=128,
            pretrain_texts=3000,
            pretrain_steps=30,
            pretrain_batch=32,
            pretrain_len=48,
            pretrain_lr=2e-3,
        ),
        "bert-classifier": dict(
            dropout=0.0,
            max_len=48,
            train_examples=2000,
            batch_size=32,
            steps=30,
            lr=2e-3,
            warmup_steps=5,
            eval_examples=64,
        ),
        "bert-qa": dict(
            dropout=0.0,
            max_len=96,
            stride=32,
            max_question_len=24,
            max_answer_len=30,
            train_max_len=64,
            train_stride=16,
            negative_fraction=0.1,
            train_examples=400,
            batch_size=16,
            steps=20,
            lr=2e-3,
            warmup_steps=5,
            eval_examples=24,
        ),
        "bert-tagger": dict(
            dropout=0.0,
            max_len=64,
            train_examples=1000,
            batch_size=32,
            steps=30,
            lr=2e-3,
            warmup_steps=5,
            eval_examples=64,
        ),
        "gpt": dict(
            dropout=0.0,
            vocab_size=400,
            d_model=32,
            num_layers=2,
            num_heads=2,
            d_ff=64,
            max_len=64,
            seq_len=64,
            train_chars=60_000,
            batch_size=16,
            steps=40,
            lr=3e-3,
            warmup_steps=5,
            eval_chars=4000,
        ),
        "vit": dict(
            dropout=0.0,
            patch_size=7,
            d_model=32,
            num_layers=2,
            num_heads=2,
            d_ff=64,
            train_examples=2000,
            batch_size=64,
            hflip=False,
            label_smoothing=0.0,
            steps=30,
            lr=3e-3,
            warmup_steps=5,
            eval_examples=256,
        ),
    },
    "default": {
        "translator": dict(
            dropout=0.0,
            vocab_size=8000,
            d_model=256,
            num_heads=4,
            d_ff=1024,
            encoder_layers=3,
            decoder_layers=3,
            max_len=256,
            train_pairs=None,
            batch_tokens=2000,
            # With Xavier-initialised projections (layers.init_weights) the decoder learns to use its
            # source within a few hundred steps; 1,000 steps reached BLEU 31.4.
            steps=650,
            lr=0.001,
            warmup_steps=100,
            label_smoothing=0.1,
            eval_examples=None,
            beam_size=4,
            reference_step_s=0.903,
            reference_other_s=67,
        ),
        # Used only when no checkpoint is available: BERT pretrained from scratch with masked-LM.
        "bert": dict(
            dropout=0.0,
            vocab_size=16000,
            hidden_size=256,
            num_layers=4,
            num_heads=4,
            intermediate_size=1024,
            max_position=512,
            pretrain_texts=None,
            pretrain_steps=800,
            pretrain_batch=64,
            pretrain_len=128,
            pretrain_lr=5e-4,
        ),
        "bert-classifier": dict(
            dropout=0.0,
            max_len=64,
            train_examples=None,
            batch_size=32,
            steps=200,
            lr=0.0001,
            warmup_steps=30,
            eval_examples=None,
            reference_step_s=0.26,
            reference_other_s=14,
        ),
        "bert-qa": dict(
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
            steps=350,
            lr=1e-4,
            warmup_steps=30,
            eval_examples=None,
            reference_step_s=0.554,
            reference_other_s=70,
        ),
        "bert-tagger": dict(
            dropout=0.0,
            max_len=128,
            train_examples=None,
            batch_size=32,
            steps=350,
            lr=1e-4,
            warmup_steps=30,
            eval_examples=None,
            reference_step_s=0.357,
            reference_other_s=38,
        ),
        "gpt": dict(
            # Several epochs of Tiny Shakespeare in the budget: without dropout the validation loss
            # stalls while the training loss keeps falling. 192 wide, not 256: at the same compute the
            # smaller model sees more text and ends lower (2.47 vs 2.58 bits per character).
            dropout=0.1,
            vocab_size=2048,
            d_model=192,
            num_layers=4,
            num_heads=4,
            d_ff=768,
            max_len=256,
            seq_len=256,  # the whole served context: every learned position is trained
            train_chars=None,
            batch_size=8,
            steps=850,
            lr=0.002,
            warmup_steps=100,
            eval_chars=None,
            reference_step_s=0.499,
            reference_other_s=13,
        ),
        "vit": dict(
            dropout=0.0,
            patch_size=7,
            d_model=128,
            num_layers=4,
            num_heads=4,
            d_ff=256,
            train_examples=None,
            batch_size=128,
            # A few epochs only: mirrored images and label smoothing slowed learning more than they
            # regularised (0.873 with both, 0.883 without, at 1,500 steps).
            hflip=False,
            label_smoothing=0.0,
            steps=2200,
            lr=2e-3,
            warmup_steps=200,
            eval_examples=None,
            reference_step_s=0.107,
            reference_other_s=5,
        ),
    },
}


def profile_settings(profile: str, model: str) -> dict[str, Any]:
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}: choose one of {sorted(PROFILES)}")
    return dict(PROFILES[profile][model])
