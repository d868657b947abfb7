"""python -m model_export all|train|export|evaluate — build and measure the model repository.

all       train, export and evaluate (what the quickstart runs when models/ is missing)
train     train and keep a torch checkpoint per model under <out>/.work/
export    export those checkpoints to ONNX, check parity, write manifests
evaluate  score exported models through ONNX Runtime on a data split
import    a Hugging Face checkpoint folder as a served model, checked against transformers (docs/IMPORT.md)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

from .data import resolve_data_dir
from .importing.checkpoint import TASKS as IMPORT_TASKS
from .machine import describe as describe_machine
from .profiles import MODEL_NAMES, PROFILES, TranslatorRecipe, recipe_for
from .publish import STAGING, PublishError, clear_staging, next_version, publish_version

log = logging.getLogger("model_export")


def _names(value: str | None) -> list[str]:
    if not value:
        return list(MODEL_NAMES)
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODEL_NAMES]
    if unknown:
        raise SystemExit(f"unknown model(s) {unknown}: choose from {MODEL_NAMES}")
    return names


def _steps(value: str | None) -> dict[str, int]:
    """--steps translator=4000,gpt=1200 -> {name: steps} (names checked against the served models)."""
    out: dict[str, int] = {}
    for item in (value or "").split(","):
        if item.strip():
            name, _, number = item.partition("=")
            if name.strip() not in MODEL_NAMES or not number.strip().isdigit():
                raise SystemExit(f"--steps wants NAME=STEPS with NAME in {MODEL_NAMES}, got {item!r}")
            out[name.strip()] = int(number)
    return out


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m model_export",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for command in ("all", "train", "export"):
        p = sub.add_parser(command)
        p.add_argument(
            "--models", help=f"comma-separated model names (default: all of {','.join(MODEL_NAMES)})"
        )
        p.add_argument("--profile", choices=sorted(PROFILES), default="default")
        p.add_argument("--data-dir", help="dataset folder (default: $DATA_DIR, else ../shared/data)")
        p.add_argument(
            "--out",
            default=os.environ.get("MODEL_REPOSITORY", "models"),
            help="model repository (default: models)",
        )
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--init-from", help="Hugging Face BERT checkpoint directory for the BERT encoder")
        p.add_argument(
            "--steps", help="optimizer steps per model, overriding the profile, e.g. translator=3000"
        )
        p.add_argument(
            "--steps-scale",
            type=float,
            default=1.0,
            help="multiply every model's step budget (warmup stays, capped at a fifth of the steps)",
        )
        p.add_argument(
            "--probe-points",
            type=int,
            help="measure each model's validation curve at this many evenly spaced steps (default: the recipe's)",
        )
        p.add_argument(
            "--max-minutes",
            type=float,
            help="wall-clock guard for the whole build: models stop early, marked under-trained, when it runs out",
        )
        if command in ("all", "export"):
            p.add_argument(
                "--publish-version",
                action="store_true",
                help="build beside the repository and publish each model as its next numbered version "
                "folder (<out>/<name>/<N>) with one rename, leaving the versions there untouched "
                "(model_export/publish.py)",
            )
        p.add_argument(
            "--device",
            default="cpu",
            help="torch device for training, e.g. cuda (budgets are calibrated for CPU)",
        )
        if command == "all":
            p.add_argument(
                "--no-variants",
                action="store_true",
                help="skip the fused / int8 / fp16 variants (model_export/variants.py)",
            )
    v = sub.add_parser("variants", help="write, check and evaluate the fused, int8 and fp16 graph variants")
    v.add_argument(
        "--models", default=os.environ.get("MODEL_REPOSITORY", "models"), help="model repository directory"
    )
    v.add_argument("--only", help="comma-separated model names (default: every model found)")
    v.add_argument("--data-dir")
    v.add_argument("--split", default="validation")
    v.add_argument("--limit", type=int, help="evaluate only the first N examples (characters for gpt)")
    v.add_argument("--beam-size", type=int, default=4, help="translator decoding (1 = greedy)")
    i = sub.add_parser(
        "import",
        help="a local Hugging Face checkpoint as a served model folder, checked against transformers",
        description="Import a fine-tuned Hugging Face checkpoint (config.json, safetensors weights, tokenizer "
        "files) as a model folder of the repository, checked against the checkpoint's own model in "
        "transformers, with its fused / int8 / fp16 variants (docs/IMPORT.md).",
    )
    i.add_argument("dir", help="the checkpoint folder")
    i.add_argument("--task", required=True, help="one of " + ", ".join(IMPORT_TASKS))
    i.add_argument("--name", required=True, help="the served model name (the folder under --out)")
    i.add_argument(
        "--out",
        default=os.environ.get("MODEL_REPOSITORY", "models"),
        help="model repository (default: models)",
    )
    i.add_argument(
        "--data",
        help="JSON lines of the user's labelled examples: the variants' accuracy rule is measured on them "
        "(default: agreement with the reference on the checkpoint's own outputs)",
    )
    i.add_argument(
        "--publish-version",
        action="store_true",
        help="import beside the repository and publish as the model's next numbered version folder",
    )
    i.add_argument("--no-variants", action="store_true", help="skip the fused / int8 / fp16 variants")
    i.add_argument("--seed", type=int, default=0)
    e = sub.add_parser("evaluate")
    e.add_argument(
        "--models", default=os.environ.get("MODEL_REPOSITORY", "models"), help="model repository directory"
    )
    e.add_argument("--only", help="comma-separated model names (default: every model found)")
    e.add_argument("--data-dir")
    e.add_argument("--split", default="validation")
    e.add_argument("--json", help="write the results here")
    e.add_argument("--limit", type=int, help="evaluate only the first N examples (characters for gpt)")
    e.add_argument("--beam-size", type=int, default=4, help="translator decoding (1 = greedy)")
    return parser


def _contexts(args: argparse.Namespace) -> list[Any]:
    from .recipes.common import BuildContext

    data_dir = resolve_data_dir(args.data_dir)
    steps = _steps(args.steps)
    if args.steps_scale <= 0:
        raise SystemExit("--steps-scale must be positive")
    if args.probe_points is not None and args.probe_points < 0:
        raise SystemExit("--probe-points must be 0 or more")
    contexts = []
    for name in _names(args.models):
        recipe = recipe_for(args.profile, name)
        if recipe.train.steps == 0:  # trained no further (bert-embedder): there are no steps to set
            if name in steps:
                raise SystemExit(f"--steps: {name} is not trained (its encoder is used as it is)")
        else:
            recipe = recipe.with_steps(max(1, round(steps.get(name, recipe.train.steps) * args.steps_scale)))
        if args.probe_points is not None:
            recipe = dataclasses.replace(recipe, probe_points=args.probe_points)
        init_from = Path(args.init_from) if args.init_from else None
        stage = None
        if getattr(args, "publish_version", False):
            try:
                next_version(Path(args.out) / name)  # refused before the build, not after it
            except PublishError as exc:
                raise SystemExit(f"--publish-version: {exc}") from exc
            stage = clear_staging(Path(args.out), name)
        contexts.append(
            BuildContext(
                name, data_dir, Path(args.out), args.profile, recipe, args.seed, init_from, stage_dir=stage
            )
        )
    return contexts


def _evaluate(
    models_dir: Path,
    names: list[str],
    data_dir: Path,
    split: str,
    limits: dict[str, int | None],
    beam_size: int,
) -> dict[str, Any]:
    from .evaluate import evaluate_model
    from .manifest import record_validation

    results: dict[str, Any] = {}
    for name in names:
        log.info("evaluating %s on %s/%s", name, data_dir, split)
        results[name] = evaluate_model(models_dir, name, data_dir, split, limits.get(name), beam_size)
        record_validation(models_dir / name, split, results[name])
        log.info("%s: %s", name, {k: v for k, v in results[name].items() if k != "samples"})
    return results


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    for noisy in ("onnx_ir", "onnxscript", "torch.onnx", "torch._dynamo", "torch.export"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # The exporter's op registry warns, four times per graph, that it skips torchvision's ops
    # (torchvision is not installed, and no model here uses one).
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    start = time.perf_counter()

    if args.command == "variants":
        from .variants import build_variants

        models_dir = Path(args.models)
        present = sorted(p.name for p in models_dir.iterdir() if (p / "manifest.json").is_file())
        names = [n.strip() for n in args.only.split(",")] if args.only else present
        if not names or any(n not in present for n in names):
            raise SystemExit(f"no exported model(s) {names} in {models_dir}")
        data_dir = resolve_data_dir(args.data_dir)
        for name in names:
            build_variants(models_dir, name, data_dir, args.split, args.limit, args.beam_size)
        log.info("variants finished in %.1f minutes", (time.perf_counter() - start) / 60)
        return 0

    if args.command == "import":
        from .importing.checkpoint import ImportRefused
        from .importing.run import import_checkpoint

        try:
            folder = import_checkpoint(
                Path(args.dir),
                args.task,
                args.name,
                Path(args.out),
                Path(args.data) if args.data else None,
                args.publish_version,
                not args.no_variants,
                args.seed,
            )
        except ImportRefused as exc:  # one line, whatever the reason quoted (docs/IMPORT.md)
            print(f"import refused: {' '.join(str(exc).split())}", file=sys.stderr)
            return 2
        print(folder)
        return 0

    if args.command == "evaluate":
        models_dir = Path(args.models)
        present = (
            sorted(p.name for p in models_dir.iterdir() if (p / "manifest.json").is_file())
            if models_dir.is_dir()
            else []
        )
        names = [n.strip() for n in args.only.split(",")] if args.only else present
        missing = [n for n in names if n not in present]
        if missing or not names:
            raise SystemExit(f"no exported model(s) {missing or names} in {models_dir}")
        data_dir = resolve_data_dir(args.data_dir)
        results = _evaluate(
            models_dir, names, data_dir, args.split, dict.fromkeys(names, args.limit), args.beam_size
        )
        _write_json(args.json, results)
        return 0

    from .estimate import deadline_share, estimate, report
    from .export import export_model
    from .machine import cpu_model
    from .recipes import RECIPES
    from .recipes.common import Trained
    from .training import configure_threads, seed_everything

    threads = configure_threads()
    contexts = _contexts(args)
    trains = args.command in ("all", "train")
    jobs = []
    if trains:
        for ctx in contexts:
            # Seeded alike whichever other models share the build; bert-qa and bert-tagger built alone
            # still differ slightly from the whole build (docs/EXPORT.md, cause not found).
            seed_everything(ctx.seed)
            jobs.append(RECIPES[ctx.name].prepare(ctx))
        estimates = estimate(
            jobs,
            export_and_evaluate=args.command == "all",
            variants=args.command == "all" and not args.no_variants,
        )
        print(report(estimates, cpu_model(), threads, args.max_minutes), file=sys.stderr, flush=True)
    built = []
    for i, ctx in enumerate(contexts):
        graphs_fn = RECIPES[ctx.name].graphs
        t0 = time.perf_counter()
        checkpoint = ctx.work_dir / "trained.pt"
        if trains:
            job = jobs[i]
            if args.max_minutes is not None:
                remaining = 60 * args.max_minutes - (time.perf_counter() - start)
                deadline_s = deadline_share(remaining, estimates[i], estimates[i + 1 :])
                job.spec = dataclasses.replace(job.spec, deadline_s=deadline_s)
            seed_everything(ctx.seed)
            trained = job.run()
            trained.training["machine"] = describe_machine(threads)
            trained.save(checkpoint)
        else:
            trained = Trained.load(checkpoint)
        if args.command in ("all", "export"):
            export_model(ctx, trained, graphs_fn(trained, ctx.seed))
            built.append(ctx)
        log.info(
            "%s: %s done in %.0fs (total %.0fs)",
            ctx.name,
            args.command,
            time.perf_counter() - t0,
            time.perf_counter() - start,
        )

    models_dir = Path(args.out) / STAGING if getattr(args, "publish_version", False) else Path(args.out)
    if args.command == "all" and built:
        limits = {ctx.name: ctx.recipe.eval_limit for ctx in built}
        beam = max((c.recipe.beam_size for c in built if isinstance(c.recipe, TranslatorRecipe)), default=1)
        figures: dict[str, Any] = {}
        for ctx in built:
            # The variants stage evaluates the reference graphs beside its own (and stamps the figures
            # with the version that lists the variants): evaluated here only where it does not run.
            if args.no_variants or not _variants(models_dir, ctx, beam):
                figures |= _evaluate(models_dir, [ctx.name], ctx.data_dir, "validation", limits, beam)
            else:
                manifest = json.loads((models_dir / ctx.name / "manifest.json").read_text())
                figures[ctx.name] = manifest["validation"]["validation"]
        budgets = {ctx.name: recipe_for(ctx.profile, ctx.name).train.steps for ctx in built}
        for name, figure in figures.items():
            _mark_final(models_dir / name, figure, budgets[name])
        summary = Path(args.out) / "evaluation.json"
        previous = json.loads(summary.read_text()) if summary.is_file() else {}
        _write_json(str(summary), {**previous, **figures})  # a partial rebuild keeps the others' figures
    if getattr(args, "publish_version", False):
        for ctx in built:
            publish_version(models_dir / ctx.name, Path(args.out) / ctx.name)
    log.info("%s finished in %.1f minutes", args.command, (time.perf_counter() - start) / 60)
    return 0


def _mark_final(folder: Path, figure: dict[str, Any], budget: int) -> None:
    """Redraw the folder's validation curve with the build's whole-split figure at the last step.

    Where `--steps` or `--steps-scale` moved the model off its profile's `budget` (or the
    `--max-minutes` guard stopped it short), the curve marks that budget too: a longer run shows
    what the steps past it would buy (docs/curves/long/).
    """
    from .training import draw_validation_curve

    training = json.loads((folder / "manifest.json").read_text()).get("training", {})
    curve = training.get("validation_curve")
    if not curve or not curve.get("points") or curve["metric"] not in figure:
        return
    points = [(int(s), float(v)) for s, v in curve["points"]]
    final = (int(training["steps"]), float(figure[curve["metric"]]))
    draw_validation_curve(
        points,
        folder / "validation_curve.png",
        folder.name,
        curve["metric"],
        curve["examples"],
        curve.get("target"),
        final,
        budget if budget != final[0] else None,
    )


def _variants(models_dir: Path, ctx: Any, beam: int) -> bool:
    """The variants stage for one exported model; False (its checked reference folder kept) if it failed."""
    from .variants import build_variants

    folder = models_dir / ctx.name
    exported = (folder / "manifest.json").read_text()
    try:
        build_variants(models_dir, ctx.name, ctx.data_dir, "validation", ctx.recipe.eval_limit, beam)
    except Exception:  # an optimization, not the model: keep the exported, checked folder
        log.exception("%s: the variants stage failed; it serves its reference graphs", ctx.name)
        (folder / "manifest.json").write_text(exported)
        for variant in ("fused", "int8", "fp16"):
            for file in folder.glob(f"*.{variant}.onnx"):
                file.unlink()
        return False
    return True


def _write_json(path: str | None, results: dict[str, Any]) -> None:
    text = json.dumps(results, indent=2)
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    raise SystemExit(main())
