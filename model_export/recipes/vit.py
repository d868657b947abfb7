"""vit: a Vision Transformer classifier on Fashion-MNIST, exported as one graph."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..data import FASHION_MNIST_CLASSES, load_fashion_mnist
from ..models.vit import ViT
from ..onnx_export import GraphSpec, auto_dims
from ..profiles import VitRecipe
from ..training import TrainResult, infinite
from . import probes
from .common import BuildContext, Trained, TrainingJob


def prepare(ctx: BuildContext[VitRecipe]) -> TrainingJob:
    recipe = ctx.recipe
    images, labels = load_fashion_mnist(ctx.data_dir, "train")
    images, labels = images[: recipe.train_examples], labels[: recipe.train_examples]
    scaled = images.astype(np.float32) / 255.0
    mean, std = float(scaled.mean()), float(scaled.std())
    pixels = torch.from_numpy((scaled - mean) / std).unsqueeze(1)  # (N, 1, 28, 28)
    targets = torch.from_numpy(labels.astype(np.int64))
    config = dataclasses.replace(
        recipe.model, image_size=28, channels=1, num_classes=len(FASHION_MNIST_CLASSES)
    )
    model = ViT(config)
    batch_size = recipe.batch_size
    background = -mean / std  # a black pixel, normalised

    def epoch(seed: int, e: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = torch.randperm(len(pixels), generator=torch.Generator().manual_seed(seed + e))
        for i in range(0, len(order) - batch_size + 1, batch_size):
            idx = order[i : i + batch_size]
            x = pixels[idx]
            generator = torch.Generator().manual_seed(seed * 7919 + e * 1000 + i)
            flip = torch.rand(len(idx), generator=generator) < 0.5
            if recipe.hflip:
                x = torch.where(
                    flip[:, None, None, None], x.flip(-1), x
                )  # clothes stay clothes when mirrored
            if recipe.crop_padding:
                x = random_crops(x, recipe.crop_padding, background, generator)
            yield x, targets[idx]

    def loss_fn(m: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]):  # type: ignore[no-untyped-def]
        x, y = batch
        return F.cross_entropy(m(x), y, label_smoothing=recipe.label_smoothing), len(y), len(y)

    def batches(seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return infinite(lambda e: epoch(seed, e))

    return TrainingJob(
        ctx,
        model,
        batches,
        loss_fn,
        "images",
        lambda r: _finish(ctx.name, recipe, model, mean, std, len(pixels), r),
        probes.vit(ctx.name, recipe, ctx.data_dir, mean, std),
    )


def random_crops(x: torch.Tensor, padding: int, fill: float, generator: torch.Generator) -> torch.Tensor:
    """Each image shifted by up to ``padding`` pixels each way: padded with ``fill``, cropped back at random."""
    b, c, h, w = x.shape
    padded = torch.full((b, c, h + 2 * padding, w + 2 * padding), fill, dtype=x.dtype)
    padded[:, :, padding : padding + h, padding : padding + w] = x
    offsets = torch.randint(0, 2 * padding + 1, (b, 2), generator=generator).tolist()
    return torch.stack([padded[k, :, dy : dy + h, dx : dx + w] for k, (dy, dx) in enumerate(offsets)])


def _finish(
    name: str,
    recipe: VitRecipe,
    model: ViT,
    mean: float,
    std: float,
    train_images: int,
    result: TrainResult,
) -> Trained:
    config = model.config
    manifest = {
        "task": "image-classification",
        "architecture": "vit",
        "description": "Vision Transformer (patch embedding, [CLS] token, learned positions), Fashion-MNIST",
        "config": dataclasses.asdict(config),
        "labels": FASHION_MNIST_CLASSES,
        "preprocessing": {
            "color_mode": "L",
            "image_size": [28, 28],
            "resample": "bilinear",
            "scale": 1 / 255,
            "mean": [mean],
            "std": [std],
            "layout": "NCHW",
            "note": "Fashion-MNIST is a light object on a black background",
        },
    }
    training = {
        "data": "fashion_mnist/train-*",
        "train_images": train_images,
        "augmentation": ", ".join(
            (["horizontal flip"] if recipe.hflip else [])
            + ([f"random crop, {recipe.crop_padding}-pixel padding"] if recipe.crop_padding else [])
        )
        or None,
        "label_smoothing": recipe.label_smoothing,
    }
    return Trained(name, model, None, manifest, training, result)


def graphs(trained: Trained, seed: int) -> dict[str, GraphSpec]:
    model = trained.model
    assert isinstance(model, ViT)
    config = model.config
    rng = np.random.default_rng(seed)

    def feed(n: int) -> dict[str, np.ndarray]:
        return {"pixel_values": rng.standard_normal((n, 1, 28, 28)).astype(np.float32)}

    graph = GraphSpec(
        file="model.onnx",
        module=model,
        example_args=(torch.from_numpy(feed(2)["pixel_values"]),),
        input_axes={"pixel_values": ["batch", 1, 28, 28]},
        output_axes={"logits": ["batch", config.num_classes]},
        dynamic_shapes=(auto_dims([0]),),
        parity_inputs=[feed(1), feed(5)],
    )
    return {"model": graph}
