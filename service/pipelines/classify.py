"""Classification pipelines: BERT [CLS] head over text, ViT over images; both return top-k labels."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image
from tokenizers import Tokenizer

from service.engine.batcher import BatcherObserver, BatchPolicy
from service.engine.manifest import required
from service.engine.repository import LoadedModel
from service.engine.sampling import softmax
from service.errors import InvalidInputError
from service.metadata import ANONYMOUS, RequestMeta

from .attention import AttentionFeeds
from .base import BatchedPipeline, Building, TextPipeline, Workers
from .contract import CLASSIFICATION_OUTPUTS, TRUNCATION_PARAMETERS, TaskContract, TensorSpec, text_input
from .image_inputs import ImageDecodeError, image_pixels, open_image, to_pixel_values
from .results import Classification, LabelScore, Outcome, Usage
from .text_inputs import CUT_RIGHT, EncodedText, Truncation, preprocess


@dataclass(frozen=True)
class PairIds:
    """A sentence pair's token ids (``[CLS] a [SEP] b [SEP]``), with its segment ids beside them; a batch may
    mix single texts (their ids alone) and pairs."""

    ids: list[int]
    type_ids: list[int]

    def __len__(self) -> int:
        return len(self.ids)


def pair_positions(
    mask: list[int], types: list[int], max_len: int, truncation: Truncation, index: int
) -> list[int]:
    """The positions of a pair's encoding that fit ``max_len``: special tokens kept, and tokens taken from the
    longer text first (transformers' ``longest_first``), at its end (right) or its start (left)."""
    length = len(mask)
    if length <= max_len:
        return list(range(length))
    truncation.kept(length, max_len, index)  # refuses when the caller asked for no truncation
    segments = [[p for p in range(length) if not mask[p] and types[p] == s] for s in (0, 1)]
    while sum(map(len, segments)) + sum(mask) > max_len:
        longer = segments[0] if len(segments[0]) >= len(segments[1]) else segments[1]
        longer.pop(0 if truncation.side == "left" else -1)
    return sorted([p for p in range(length) if mask[p]] + segments[0] + segments[1])


def pair_ids(
    tokenizer: Tokenizer, first: str, second: str, max_len: int, truncation: Truncation, index: int
) -> tuple[PairIds, bool]:
    """One sentence pair's ids and segment ids cut to ``max_len`` (``pair_positions``), and whether they
    were cut."""
    e = tokenizer.encode(first, second)
    kept = pair_positions(list(e.special_tokens_mask), list(e.type_ids), max_len, truncation, index)
    return PairIds([e.ids[p] for p in kept], [e.type_ids[p] for p in kept]), len(kept) < len(e.ids)


def top_labels(probs: np.ndarray, labels: list[str], top_k: int, truncated: bool = False) -> Classification:
    """The ``top_k`` most probable labels (ties keep label order); top_k beyond the label count means all."""
    order = np.argsort(-probs, kind="stable")[: max(1, min(top_k, len(labels)))]
    top = [LabelScore(labels[i], float(probs[i])) for i in order]
    return Classification(top[0].label, top[0].score, top, truncated)


class TextClassifier(TextPipeline[np.ndarray]):
    """Text -> label probabilities. Texts longer than the model's window are cut to it (``truncated``)."""

    contract = TaskContract(
        "text-classification",
        "bert-classifier",
        (text_input("text", "UTF-8 text"),),
        CLASSIFICATION_OUTPUTS,
        TRUNCATION_PARAMETERS,
    )

    @property
    def labels(self) -> list[str]:
        return required(self.model.manifest.labels)

    def run_batch(self, items: list[list[int] | PairIds]) -> Sequence[np.ndarray]:  # type: ignore[override]
        if not any(isinstance(item, PairIds) for item in items):
            return list(softmax(self.run_padded(items)[0]))  # type: ignore[arg-type]
        rows = [item.ids if isinstance(item, PairIds) else item for item in items]
        types = [item.type_ids if isinstance(item, PairIds) else [0] * len(item) for item in items]
        return list(softmax(self.run_padded(rows, types)[0]))

    def encode_pairs(
        self, pairs: Sequence[tuple[str, str | None]], truncation: Truncation = CUT_RIGHT
    ) -> list[EncodedText]:
        """Each item's ids: a single text as ``encode`` cuts it, a pair as ``PairIds`` (``pair_positions``)."""
        encoded: list[EncodedText] = []
        for index, (first, second) in enumerate(pairs):
            if second is None:
                encoded.append(self.encode([first], truncation)[0])
                continue
            ids, cut = pair_ids(self.tokenizer, first, second, self.max_len, truncation, index)
            encoded.append(EncodedText(ids, cut))  # type: ignore[arg-type]
        return encoded

    async def classify_pairs(
        self,
        pairs: Sequence[tuple[str, str | None]],
        top_k: int,
        truncation: Truncation = CUT_RIGHT,
        meta: RequestMeta = ANONYMOUS,
    ) -> Outcome[Classification]:
        """Sentence pairs (and single texts, ``None`` second) -> label probabilities, as TEI's /predict."""
        with self.batcher.reserve(len(pairs), meta) as permit:
            size = sum(len(a) + len(b or "") for a, b in pairs)
            encoded = await preprocess(size, self.encode_pairs, pairs, truncation)
            probs = await self.infer([e.ids for e in encoded], [len(e.ids) for e in encoded], permit, meta)
        results = [
            top_labels(p, self.labels, top_k, e.truncated) for p, e in zip(probs, encoded, strict=True)
        ]
        return Outcome(self.name, self.model.version, results, Usage(sum(len(e.ids) for e in encoded)))

    async def classify(
        self,
        texts: Sequence[str],
        top_k: int,
        truncation: Truncation = CUT_RIGHT,
        meta: RequestMeta = ANONYMOUS,
    ) -> Outcome[Classification]:
        encoded, probs = await self.run_texts(texts, truncation, meta)
        results = [
            top_labels(p, self.labels, top_k, e.truncated) for p, e in zip(probs, encoded, strict=True)
        ]
        usage = Usage(input_tokens=sum(len(e.ids) for e in encoded))
        return Outcome(self.name, self.model.version, results, usage)

    def attention_feeds(self, text: str, result: Classification) -> AttentionFeeds:
        return self.token_feeds(self.encode([text])[0].ids)

    async def warmup(self) -> None:
        await self.classify(["warm-up"], top_k=1)


class ImageClassifier(BatchedPipeline[np.ndarray, np.ndarray]):
    """Image bytes (PNG/JPEG, any size and mode) -> label probabilities, preprocessed exactly as in training."""

    contract = TaskContract(
        "image-classification",
        "vit",
        (TensorSpec("image", "BYTES", "PNG/JPEG bytes (base64 of them in JSON, where BYTES are strings)"),),
        CLASSIFICATION_OUTPUTS,
        decode="image",
    )

    @classmethod
    def build(cls, model: LoadedModel, building: Building) -> ImageClassifier:
        s = building.settings
        return cls(
            model,
            building.policy(),
            s.max_image_pixels,
            building.batcher_observer(model.name),
            max_request_pixels=s.max_request_pixels,
            workers=building.workers,
        )

    def __init__(
        self,
        model: LoadedModel,
        policy: BatchPolicy,
        max_image_pixels: int,
        observer: BatcherObserver | None = None,
        max_request_pixels: int | None = None,
        workers: Workers | None = None,
    ) -> None:
        super().__init__(model, policy, observer, workers)
        self.labels = required(model.manifest.labels)
        self.preprocessing = required(model.manifest.preprocessing)
        self.max_image_pixels = max_image_pixels
        self.max_request_pixels = max_request_pixels
        self.graph = model.graphs["model"]
        config = model.manifest.config
        # The batcher's token budget counts patches (+ [CLS]): every image costs the same.
        size, patch = config.get("image_size"), config.get("patch_size")
        self.cost = (size // patch) ** 2 + 1 if size and patch else 1

    def run_batch(self, items: list[np.ndarray]) -> Sequence[np.ndarray]:
        pixels = to_pixel_values(np.stack(items), self.preprocessing)
        logits = self.graph.run({self.graph.input_names[0]: pixels})[0]
        return list(softmax(logits))

    def decode(self, images: Sequence[bytes]) -> list[np.ndarray]:
        """Every image's header first (format, MAX_IMAGE_PIXELS, and the request's pixels together against
        MAX_REQUEST_PIXELS), then the pixels: no image is decoded unless all of them may be."""
        opened = []
        total = 0
        for index, data in enumerate(images):
            try:
                image = open_image(data, self.max_image_pixels)
            except ImageDecodeError as exc:
                raise InvalidInputError(str(exc), "inputs", "undecodable_image", index) from exc
            total += image.width * image.height
            if self.max_request_pixels is not None and total > self.max_request_pixels:
                raise InvalidInputError(
                    f"the request's images hold more than {self.max_request_pixels} pixels together "
                    f"(MAX_REQUEST_PIXELS); this one brings them to {total}",
                    "inputs",
                    "too_large",
                    index,
                )
            opened.append(image)
        decoded = []
        for index, image in enumerate(opened):
            try:
                decoded.append(image_pixels(image, self.preprocessing))
            except ImageDecodeError as exc:
                raise InvalidInputError(str(exc), "inputs", "undecodable_image", index) from exc
        return decoded

    async def classify(
        self, images: Sequence[bytes], top_k: int, meta: RequestMeta = ANONYMOUS
    ) -> Outcome[Classification]:
        """An undecodable image is reported by its index among ``images``."""
        with self.batcher.reserve(
            len(images), meta
        ) as permit:  # a full queue refuses before decoding is paid for
            # Always in a thread: a few compressed bytes may still decode to MAX_IMAGE_PIXELS pixels.
            decoded = await asyncio.to_thread(self.decode, images)
            probs = await self.infer(decoded, [self.cost] * len(decoded), permit, meta)
        results = [top_labels(p, self.labels, top_k) for p in probs]
        return Outcome(self.name, self.model.version, results, Usage(input_tokens=self.cost * len(decoded)))

    def attention_length(self, image: bytes) -> tuple[int, str]:
        return self.cost, "inputs"

    def attention_feeds(self, image: bytes, result: Classification) -> AttentionFeeds:
        """[CLS]'s row of one image's self-attention, over the patches laid out as their grid."""
        assert self.attention_maps.spec is not None
        (decoded,) = self.decode([image])
        pixels = to_pixel_values(decoded[None], self.preprocessing)
        config = self.model.manifest.config
        patches = self.cost - 1
        rows = config.get("image_size", 0) // max(1, config.get("patch_size", 1))
        rows = rows if rows * rows == patches else 1  # a square grid, or else one row
        cols = patches // rows
        return AttentionFeeds(
            {self.attention_maps.spec.inputs[0].name: pixels},
            "cls_to_patches",
            [str(r) for r in range(rows)],
            [str(c) for c in range(cols)],
            grid=(rows, cols),
        )

    async def warmup(self) -> None:
        height, width = self.preprocessing.image_size
        png = io.BytesIO()
        Image.new("L", (width, height)).save(png, format="PNG")
        await self.classify([png.getvalue()], top_k=1)
