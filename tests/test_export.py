"""The exported model repository: manifests, torch vs ONNX Runtime parity, KV-cached decoding, the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from parity import check_close, check_outputs_equal

from model_export.evaluate import METRIC_KEYS
from model_export.onnx_export import check_parity
from model_export.profiles import MODEL_NAMES
from model_export.recipes import RECIPES
from model_export.recipes.common import Trained
from service.engine.kv_cache import CacheLayout
from service.engine.manifest import Manifest, content_version, file_sha256, required
from service.engine.repository import LoadedModel, load_model
from service.engine.runtime import RuntimeOptions
from service.engine.sampling import logprobs
from service.engine.seq2seq import Seq2SeqModel
from service.pipelines.translate import prepare_source

ROOT = Path(__file__).resolve().parents[1]
CPU = RuntimeOptions(device="cpu")


@pytest.fixture(scope="module")
def gpt(tiny_models: Path) -> LoadedModel:
    return load_model(tiny_models / "gpt", CPU)


@pytest.fixture(scope="module")
def translator(tiny_models: Path) -> LoadedModel:
    return load_model(tiny_models / "translator", CPU)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_manifest_is_complete_and_consistent(tiny_models: Path, name: str) -> None:
    manifest = json.loads((tiny_models / name / "manifest.json").read_text())
    for key in (
        "task",
        "architecture",
        "version",
        "files",
        "graphs",
        "training",
        "export",
        "validation",
        "config",
    ):
        assert key in manifest, f"{name} manifest lacks {key}"
    assert manifest["version"] == content_version(manifest["files"])
    for file, entry in manifest["files"].items():
        assert file_sha256(tiny_models / name / file) == entry["sha256"]
    assert manifest["export"]["parity_max_abs_diff"] < 1e-3
    if manifest["training"]["planned_steps"]:  # bert-embedder trains nothing, so it has no curve
        assert (tiny_models / name / "training_curve.png").stat().st_size > 1000
        assert (tiny_models / name / "validation_curve.png").stat().st_size > 1000
    else:
        assert manifest["training"]["curve"] is None
        assert "validation_curve" not in manifest["training"]
    assert set(METRIC_KEYS[name]) <= set(manifest["validation"]["validation"])
    if manifest["task"] in ("text-generation", "translation"):
        kv = manifest["kv_cache"]
        assert kv["axes"] == ["batch", "num_heads", "past_sequence", "head_dim"]
    typed = Manifest.model_validate(manifest)  # what export writes is what the service parses
    if typed.kv_cache is not None:
        decoder = typed.graphs["decoder" if typed.task == "translation" else "model"]
        inputs = [t.name for t in decoder.inputs]
        outputs = [t.name for t in decoder.outputs]
        assert typed.kv_cache.past_names == [n for n in inputs if n.startswith("past_")]
        assert typed.kv_cache.present_names == [n for n in outputs if n.startswith("present_")]


# The probe's metric scores the same examples as the build's evaluation in the tiny profile (greedy
# translation included: its evaluation decodes with beam 1), so torch's figure and the ONNX one agree.
PROBED = {
    "translator": "bleu",
    "bert-classifier": "accuracy",
    "bert-qa": "f1",
    "bert-tagger": "entity_f1",
    "gpt": "bits_per_char",
    "vit": "accuracy",
}


@pytest.mark.parametrize("name", sorted(PROBED))
def test_validation_curve_ends_at_the_onnx_evaluation(tiny_models: Path, name: str) -> None:
    """The last probe point (torch, during training) equals the ONNX Runtime evaluation of the export."""
    manifest = json.loads((tiny_models / name / "manifest.json").read_text())
    curve = manifest["training"]["validation_curve"]
    steps = manifest["training"]["steps"]
    assert curve["metric"] == PROBED[name]
    assert [s for s, _ in curve["points"]] == [steps // 2, steps]  # the tiny profile's two points
    figure = manifest["validation"]["validation"][PROBED[name]]
    tolerance = 0.5 if name == "translator" else 2e-3  # BLEU, 0-100: a step limit may end a row apart
    assert curve["points"][-1][1] == pytest.approx(figure, abs=tolerance), (curve, figure)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_torch_and_onnxruntime_agree_on_every_graph(tiny_models: Path, name: str) -> None:
    """Re-check parity from the trained checkpoint on fresh random inputs of other shapes than the export's."""
    trained = Trained.load(tiny_models / ".work" / name / "trained.pt")
    _, graphs_fn = RECIPES[name]
    for spec in graphs_fn(trained, seed=123).values():  # a different seed: other shapes and values
        diff = check_parity(
            tiny_models / name / spec.file, spec.module, list(spec.input_axes), spec.parity_inputs, 1e-4
        )
        assert diff < 1e-4


def _gpt_feeds(
    model: LoadedModel, ids: np.ndarray, mask: np.ndarray, past: list[np.ndarray] | None
) -> dict[str, np.ndarray]:
    layout = CacheLayout.of(required(model.manifest.kv_cache))
    names = layout.past_names
    if past is None:  # an empty (zero-length) past
        past = layout.empty(ids.shape[0])
    positions = np.clip(np.cumsum(mask, axis=1) - 1, 0, None)[:, -ids.shape[1] :]
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": positions,
        **dict(zip(names, past, strict=True)),
    }


def _gpt_greedy(model: LoadedModel, prompts: list[list[int]], steps: int, cached: bool) -> list[list[int]]:
    """Left-padded batch greedy decoding, either with the KV cache or recomputing the whole prefix each step."""
    width = max(map(len, prompts))
    ids = np.array([[0] * (width - len(p)) + p for p in prompts], dtype=np.int64)
    mask = np.array([[0] * (width - len(p)) + [1] * len(p) for p in prompts], dtype=np.int64)
    graph = model.graphs["model"]
    out: list[list[int]] = [[] for _ in prompts]
    past = None
    new = ids
    for _ in range(steps):
        results = graph.run(_gpt_feeds(model, new if cached else ids, mask, past if cached else None))
        nxt = results[0][:, -1].argmax(-1)
        for row, token in zip(out, nxt, strict=True):
            row.append(int(token))
        past = results[1:]
        new = nxt[:, None].astype(np.int64)
        ids = np.concatenate([ids, new], axis=1)
        mask = np.concatenate([mask, np.ones((len(prompts), 1), np.int64)], axis=1)
    return out


def test_gpt_cached_greedy_equals_recomputation_batch_1(gpt: LoadedModel) -> None:
    prompt = gpt.tokenizer.encode("ROMEO:\nWhat light").ids
    check_outputs_equal(
        _gpt_greedy(gpt, [prompt], 20, cached=True),
        _gpt_greedy(gpt, [prompt], 20, cached=False),
        name_a="KV-cached",
        name_b="recomputed",
    )


def test_gpt_cached_greedy_equals_recomputation_left_padded(gpt: LoadedModel) -> None:
    prompts = [
        gpt.tokenizer.encode(t).ids
        for t in ("First Citizen:\nBefore we", "KING:", "O, what a rogue and peasant")
    ]
    batched = _gpt_greedy(gpt, prompts, 16, cached=True)
    check_outputs_equal(
        batched,
        _gpt_greedy(gpt, prompts, 16, cached=False),
        name_a="KV-cached batch",
        name_b="recomputed batch",
    )
    alone = [_gpt_greedy(gpt, [p], 16, cached=False)[0] for p in prompts]  # padding changes nothing
    check_outputs_equal(batched, alone, name_a="KV-cached batch", name_b="recomputed alone")


def test_gpt_zero_length_past(gpt: LoadedModel) -> None:
    ids = np.array([gpt.tokenizer.encode("Hello").ids], dtype=np.int64)
    results = gpt.graphs["model"].run(_gpt_feeds(gpt, ids, np.ones_like(ids), None))
    assert results[0].shape[:2] == ids.shape and np.isfinite(results[0]).all()
    assert results[1].shape[2] == ids.shape[1]  # present = empty past + the prompt


def _source(model: LoadedModel, s2s: Seq2SeqModel, text: str) -> list[int]:
    """The text's source ids as the served translator prepares them (the step limits are each test's own)."""
    assert model.tokenizer is not None
    return prepare_source(model.manifest, model.tokenizer.encode(text).ids, s2s.max_new_tokens)[0]


def _translator_recompute(model: LoadedModel, source: list[int], steps: int) -> list[int]:
    """Greedy translation recomputing the decoder over the whole prefix (empty past) at every step."""
    s2s = Seq2SeqModel(model.graphs["encoder"], model.graphs["decoder"], model.manifest)
    cross, src_mask = s2s.encode([source])
    tokens = [s2s.bos_id]
    out: list[int] = []
    for _ in range(steps):
        feeds = {
            "input_ids": np.array([tokens], dtype=np.int64),
            "attention_mask": np.ones((1, len(tokens)), dtype=np.int64),
            "position_ids": np.arange(len(tokens), dtype=np.int64)[None],
            s2s.cross_mask_name: src_mask,
            **cross,
            **dict(zip(s2s.layout.past_names, s2s.layout.empty(1), strict=True)),
        }
        nxt = int(logprobs(model.graphs["decoder"].run(feeds)[0][0, -1]).argmax())
        if nxt == s2s.eos_id:
            break
        out.append(nxt)
        tokens.append(nxt)
    return out


def test_translator_cached_greedy_equals_recomputation(translator: LoadedModel) -> None:
    s2s = Seq2SeqModel(translator.graphs["encoder"], translator.graphs["decoder"], translator.manifest)
    texts = ["A man is riding a bike.", "Two dogs play in the snow near a small red house.", "Hello"]
    sources = [_source(translator, s2s, t) for t in texts]
    batched = s2s.greedy(sources, 12)  # right-padded sources of different lengths in one batch
    recomputed = [_translator_recompute(translator, s, 12) for s in sources]
    check_outputs_equal(
        [h.tokens for h in batched],
        [full[: len(h.tokens)] for full, h in zip(recomputed, batched, strict=True)],
        name_a="KV-cached batch",
        name_b="recomputed alone",
    )
    for hyp in batched:
        assert len(hyp.tokens) == 12 or hyp.finished
    check_outputs_equal(
        [h.tokens for h in batched],
        [s2s.greedy([s], 12)[0].tokens for s in sources],
        name_a="KV-cached batch",
        name_b="KV-cached alone",
    )


def test_translator_decoder_left_padding_changes_nothing(translator: LoadedModel) -> None:
    s2s = Seq2SeqModel(translator.graphs["encoder"], translator.graphs["decoder"], translator.manifest)
    source = _source(translator, s2s, "A girl in a pink dress.")
    cross, src_mask = s2s.encode([source])
    prefix = [s2s.bos_id, 40, 41, 42]
    pad = 3

    def run(tokens: list[int], mask: list[int]) -> np.ndarray:
        positions = np.clip(np.cumsum(mask) - 1, 0, None)
        feeds = {
            "input_ids": np.array([tokens], dtype=np.int64),
            "attention_mask": np.array([mask], dtype=np.int64),
            "position_ids": positions[None].astype(np.int64),
            s2s.cross_mask_name: src_mask,
            **cross,
            **dict(zip(s2s.layout.past_names, s2s.layout.empty(1), strict=True)),
        }
        return translator.graphs["decoder"].run(feeds)[0][0]

    plain = run(prefix, [1] * len(prefix))
    padded = run([0] * pad + prefix, [0] * pad + [1] * len(prefix))
    check_close(plain, padded[pad:], atol=1e-4, name_a="unpadded", name_b="left-padded")


def test_beam_one_equals_greedy(translator: LoadedModel) -> None:
    s2s = Seq2SeqModel(translator.graphs["encoder"], translator.graphs["decoder"], translator.manifest)
    sources = [_source(translator, s2s, t) for t in ("A dog runs.", "People walk down a busy street.")]
    greedy = [h.tokens for h in s2s.greedy(sources, 15)]
    beam = [r[0].tokens for r in s2s.beam_search(sources, 1, 15)]
    check_outputs_equal(beam, greedy, name_a="beam 1", name_b="greedy")


def test_beam_search_returns_sorted_distinct_hypotheses(translator: LoadedModel) -> None:
    s2s = Seq2SeqModel(translator.graphs["encoder"], translator.graphs["decoder"], translator.manifest)
    source = _source(translator, s2s, "A man sleeps on a bench.")
    hyps = s2s.beam_search([source], 4, 12, num_return=3)[0]
    assert len(hyps) == 3
    assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
    assert len({tuple(h.tokens) for h in hyps}) == 3


def test_evaluate_cli_writes_the_agreed_keys(model_repo: Path, data_dir: Path, tmp_path: Path) -> None:
    # A private copy: evaluate records its figures in the manifests, which other tests read.
    out = tmp_path / "eval.json"
    cmd = [
        sys.executable,
        "-m",
        "model_export",
        "evaluate",
        "--models",
        str(model_repo),
        "--data-dir",
        str(data_dir),
        "--split",
        "validation",
        "--json",
        str(out),
        "--limit",
        "16",
        "--beam-size",
        "1",
    ]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, timeout=300)
    results = json.loads(out.read_text())
    assert set(results) == set(MODEL_NAMES)
    for name, keys in METRIC_KEYS.items():
        for key in [*keys, "examples", "seconds"]:
            assert isinstance(results[name][key], (int, float)), f"{name}.{key}"
        assert results[name]["examples"] == 16


def test_cli_names_the_missing_data_file(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "model_export",
        "train",
        "--profile",
        "tiny",
        "--models",
        "gpt",
        "--data-dir",
        str(tmp_path),
        "--out",
        str(tmp_path / "m"),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert str(tmp_path / "tinyshakespeare" / "train.txt") in proc.stderr


def test_export_alone_rebuilds_from_the_checkpoint(tiny_models: Path, tmp_path: Path) -> None:
    """`train` then `export` as separate commands: export reads the checkpoint train left."""
    out = tmp_path / "models"
    (out / ".work" / "vit").mkdir(parents=True)
    (out / ".work" / "vit" / "trained.pt").write_bytes(
        (tiny_models / ".work" / "vit" / "trained.pt").read_bytes()
    )
    cmd = [
        sys.executable,
        "-m",
        "model_export",
        "export",
        "--profile",
        "tiny",
        "--models",
        "vit",
        "--out",
        str(out),
    ]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, timeout=300)
    model = load_model(out / "vit", CPU)
    pixels = np.random.default_rng(0).standard_normal((2, 1, 28, 28)).astype(np.float32)
    trained = Trained.load(out / ".work" / "vit" / "trained.pt")
    with torch.no_grad():
        expected = trained.model(torch.from_numpy(pixels)).numpy()
    check_close(
        model.graphs["model"].run({"pixel_values": pixels})[0],
        expected,
        atol=1e-4,
        name_a="onnxruntime",
        name_b="torch",
    )
