"""Malformed checkpoints through the real CLI (``python -m model_export import``): each is one line,
``import refused: …`` naming the file and the field, exit status 2, never a traceback (docs/IMPORT.md);
a ``modules.json`` naming a class outside sentence-transformers' own is refused before anything of it
is imported. The checkpoints are written here: a config, a tokenizer, an empty weights file (nothing
reaches the weights)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]

BERT = {
    "model_type": "bert",
    "architectures": ["BertForSequenceClassification"],
    "vocab_size": 16,
    "hidden_size": 8,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 16,
    "max_position_embeddings": 32,
    "type_vocab_size": 2,
    "id2label": {"0": "negative", "1": "positive"},
    "label2id": {"negative": 0, "positive": 1},
}
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "fine", "film"]


def _tokenizer_json() -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordPiece({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return tokenizer.to_str()


def _checkpoint(folder: Path, config: dict[str, Any] | str, **files: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    (folder / "model.safetensors").write_bytes(b"")  # present, never read: every refusal comes first
    files.setdefault("tokenizer.json", _tokenizer_json())
    for name, text in files.items():
        (folder / name.replace("__", "/")).parent.mkdir(parents=True, exist_ok=True)
        (folder / name.replace("__", "/")).write_text(text)
    return folder


def _embedder(folder: Path, modules: Any) -> Path:
    config = {**BERT, "architectures": ["BertModel"]}
    pooling = json.dumps({"word_embedding_dimension": 8, "pooling_mode_mean_tokens": True})
    return _checkpoint(
        folder, config, **{"modules.json": json.dumps(modules), "1_Pooling__config.json": pooling}
    )


def _without(key: str) -> dict[str, Any]:
    return {k: v for k, v in BERT.items() if k != key}


GPT2 = {
    "model_type": "gpt2",
    "architectures": ["GPT2LMHeadModel"],
    "vocab_size": 16,
    "n_embd": 8,
    "n_layer": 1,
    "n_head": 2,
    "n_positions": 32,
}
MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
]
NESTED = '{"a":' * 100_000 + "1" + "}" * 100_000

# name -> (how the checkpoint is made, its task, what the one line must name)
CASES: dict[str, tuple[Callable[[Path], Path], str, tuple[str, ...]]] = {
    "malformed tokenizer.json": (
        lambda f: _checkpoint(f, BERT, **{"tokenizer.json": '{"version": "1.0", "truncation": null}'}),
        "text-classification",
        ("tokenizer.json", "Model missing"),  # tokenizers' own words for its field
    ),
    "tokenizer.json not JSON": (
        lambda f: _checkpoint(f, BERT, **{"tokenizer.json": "{not json"}),
        "text-classification",
        ("tokenizer.json",),
    ),
    "config nested 100,000 deep": (
        lambda f: _checkpoint(f, NESTED),
        "text-classification",
        ("config.json", "nested too deeply"),
    ),
    "config.json a list": (
        lambda f: _checkpoint(f, "[1, 2]"),
        "text-classification",
        ("config.json", "not a JSON object"),
    ),
    "no hidden_size": (
        lambda f: _checkpoint(f, _without("hidden_size")),
        "text-classification",
        ("config.json", "hidden_size"),
    ),
    "vocab_size abc": (
        lambda f: _checkpoint(f, {**BERT, "vocab_size": "abc"}),
        "text-classification",
        ("config.json", "vocab_size", "'abc'"),
    ),
    "id2label key x": (
        lambda f: _checkpoint(f, {**BERT, "id2label": {"0": "negative", "x": "positive"}}),
        "text-classification",
        ("config.json", "id2label", "'x'"),
    ),
    "architectures a number": (
        lambda f: _checkpoint(f, {**BERT, "architectures": 5}),
        "text-classification",
        ("config.json", "architectures"),
    ),
    "modules.json an object": (
        lambda f: _embedder(f, {"0": MODULES[0]}),
        "feature-extraction",
        ("modules.json", "list"),
    ),
    "modules.json entry without a type": (
        lambda f: _embedder(f, [MODULES[0], {"path": "1_Pooling"}]),
        "feature-extraction",
        ("modules.json", "[1]", "type"),
    ),
    "modules.json path outside": (
        lambda f: _embedder(f, [MODULES[0], {**MODULES[1], "path": "../../elsewhere"}]),
        "feature-extraction",
        ("modules.json", "[1]", "path"),
    ),
    "preprocessor size a number": (
        lambda f: _checkpoint(
            f,
            {
                "model_type": "vit",
                "architectures": ["ViTForImageClassification"],
                "hidden_size": 8,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
                "image_size": 16,
                "patch_size": 8,
                "id2label": {"0": "cat", "1": "dog"},
            },
            **{
                "preprocessor_config.json": json.dumps(
                    {"image_processor_type": "ViTImageProcessor", "size": 16}
                )
            },
        ),
        "image-classification",
        ("preprocessor_config.json", "size"),
    ),
    "generation bad_words_ids not lists": (
        lambda f: _checkpoint(
            f,
            {**GPT2, "eos_token_id": 0},
            **{"generation_config.json": json.dumps({"eos_token_id": 0, "bad_words_ids": [5]})},
        ),
        "text-generation",
        ("bad_words_ids", "list of lists"),
    ),
    "generation eos a string": (
        lambda f: _checkpoint(
            f,
            {**GPT2, "eos_token_id": "end"},
        ),
        "text-generation",
        ("eos_token_id", "'end'"),
    ),
}


def _import(folder: Path, task: str, out: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "model_export",
            "import",
            str(folder),
            "--task",
            task,
            "--name",
            "m",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )


def _one_refusal(answer: subprocess.CompletedProcess[str]) -> str:
    assert answer.returncode == 2, (answer.returncode, answer.stderr[-3000:])
    assert "Traceback" not in answer.stderr, answer.stderr[-3000:]
    lines = [line for line in answer.stderr.splitlines() if line.strip()]
    refusals = [line for line in lines if line.startswith("import refused:")]
    assert len(refusals) == 1, lines
    return refusals[0]


@pytest.mark.parametrize("case", list(CASES))
def test_a_malformed_checkpoint_is_one_line_naming_the_file_and_field(case: str, tmp_path: Path) -> None:
    make, task, named = CASES[case]
    folder = make(tmp_path / "checkpoint")
    line = _one_refusal(_import(folder, task, tmp_path / "out"))
    for part in named:
        assert part in line, (part, line)
    assert len(line) < 2000, line  # a line a person reads: the nested config is not echoed back
    assert not (tmp_path / "out" / "m").exists()


def test_a_module_outside_sentence_transformers_is_refused_before_it_is_imported(tmp_path: Path) -> None:
    """``evil.models.Transformer`` ends as the real class path does; it is refused by exact name, and the
    package it names (on the path here, leaving a mark when imported) is never imported."""
    package = tmp_path / "site" / "evil" / "models"
    package.mkdir(parents=True)
    mark = tmp_path / "imported"
    (package.parent / "__init__.py").write_text(f"open({str(mark)!r}, 'w').write('evil')\n")
    (package / "__init__.py").write_text("class Transformer: ...\n")
    folder = _embedder(
        tmp_path / "checkpoint", [{**MODULES[0], "type": "evil.models.Transformer"}, MODULES[1]]
    )
    line = _one_refusal(
        _import(folder, "feature-extraction", tmp_path / "out", PYTHONPATH=str(tmp_path / "site"))
    )
    assert "modules.json" in line and "'evil.models.Transformer'" in line, line
    assert "sentence_transformers.models.Transformer" in line  # what would be taken
    assert not mark.exists()


def test_the_well_formed_module_list_passes_the_module_checks(tmp_path: Path) -> None:
    """The control: sentence-transformers' own modules, by their exact class paths, pass the checks that
    refused the cases above."""
    from model_export.importing.checkpoint import inspect

    folder = _embedder(tmp_path / "checkpoint", MODULES)
    checkpoint = inspect(folder, "feature-extraction")
    assert checkpoint.sentence_transformers["modules"] == [m["type"] for m in MODULES]
    assert checkpoint.hidden_size == 8 and checkpoint.labels is None
