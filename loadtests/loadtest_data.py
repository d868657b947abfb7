"""Request inputs for the load tests, read from the VALIDATION splits of the data directory.

No locust, no torch, no numpy, no project imports: only the standard library (PNG images are
encoded here with zlib), so the locustfile runs in a bare load-generator container (the stock
``locustio/locust`` image) and the tests can import this module without gevent's monkey-patching.

The data directory is ``DATA_DIR`` when set, else ``../shared/data`` next to the repository
(the layout of /work/shared/data/README.md). Every dataset whose files are missing falls back
to a small built-in sample set, so a load test runs anywhere (and says which sets fell back).
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import random
import re
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Stay well inside the service's default limits (MAX_TEXT_CHARS 4096, MAX_CONTEXT_CHARS 3000).
MAX_TEXT_CHARS = 4096
MAX_CONTEXT_CHARS = 3000
MAX_PROMPT_CHARS = 400


def resolve_data_dir(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    """``explicit``, else ``DATA_DIR``, else ``../shared/data`` next to the repository.

    None (built-in samples) when the chosen directory does not exist: a path that was named but is
    missing does not fall through to another one.
    """
    chosen = explicit if explicit is not None else os.environ.get("DATA_DIR")
    path = Path(chosen) if chosen else REPO.parent / "shared" / "data"
    return path if path.is_dir() else None


# --------------------------------------------------------------------------------------------------------
# Readers, one per dataset; each returns [] when its file is missing.


def read_multi30k(data_dir: Path | None) -> list[str]:
    """English validation sentences of Multi30k (one per line of ``multi30k/validation.en.gz``)."""
    path = data_dir / "multi30k" / "validation.en.gz" if data_dir else None
    if path is None or not path.is_file():
        return []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.strip()[:MAX_TEXT_CHARS] for line in f if line.strip()]


def read_sst2(data_dir: Path | None) -> list[str]:
    """SST-2 validation sentences (``sst2/validation.tsv``, header ``sentence<TAB>label``)."""
    path = data_dir / "sst2" / "validation.tsv" if data_dir else None
    if path is None or not path.is_file():
        return []
    texts = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        if i == 0 or "\t" not in line:
            continue
        sentence = line.rsplit("\t", 1)[0].strip()
        if sentence:
            texts.append(sentence[:MAX_TEXT_CHARS])
    return texts


def read_squad(data_dir: Path | None) -> list[tuple[str, str]]:
    """(question, context) pairs of the SQuAD validation split (``squad/validation.json``)."""
    path = data_dir / "squad" / "validation.json" if data_dir else None
    if path is None or not path.is_file():
        return []
    data = json.loads(path.read_text(encoding="utf-8"))
    pairs = []
    for article in data["data"]:
        for paragraph in article["paragraphs"]:
            context = paragraph["context"][:MAX_CONTEXT_CHARS]
            for qa in paragraph["qas"]:
                question = qa["question"].strip()[:MAX_TEXT_CHARS]
                if question and context.strip():
                    pairs.append((question, context))
    return pairs


_NO_SPACE_BEFORE = re.compile(r" ([.,;:!?%)\]}]|'s\b|n't\b|'re\b|'ve\b|'ll\b|'d\b|'m\b)")
_NO_SPACE_AFTER = re.compile(r"([(\[{$]) ")


def detokenize(tokens: list[str]) -> str:
    """CoNLL tokens -> readable text (no space before closing punctuation and clitics)."""
    text = " ".join(tokens)
    text = _NO_SPACE_BEFORE.sub(r"\1", text)
    return _NO_SPACE_AFTER.sub(r"\1", text)


def read_conll(data_dir: Path | None, min_tokens: int = 4) -> list[str]:
    """CoNLL-2003 validation sentences with at least ``min_tokens`` tokens, joined as text."""
    path = data_dir / "conll2003" / "validation.txt" if data_dir else None
    if path is None or not path.is_file():
        return []
    sentences: list[str] = []
    tokens: list[str] = []

    def flush() -> None:
        if len(tokens) >= min_tokens:
            sentences.append(detokenize(tokens)[:MAX_TEXT_CHARS])
        tokens.clear()

    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            flush()
        elif line.startswith("-DOCSTART-"):
            tokens.clear()
        else:
            tokens.append(line.split(" ", 1)[0])
    flush()
    return sentences


@dataclass(frozen=True)
class GreyImage:
    """An 8-bit grey-scale image: ``pixels`` row-major, ``height * width`` bytes, 0 = black."""

    pixels: bytes
    height: int = 28
    width: int = 28


def read_fashion_mnist(data_dir: Path | None) -> list[GreyImage]:
    """Fashion-MNIST validation images (``fashion_mnist/validation-images-idx3-ubyte.gz``, 28x28 each)."""
    path = data_dir / "fashion_mnist" / "validation-images-idx3-ubyte.gz" if data_dir else None
    if path is None or not path.is_file():
        return []
    with gzip.open(path, "rb") as f:
        raw = f.read()
    magic, count, rows, cols = struct.unpack(">IIII", raw[:16])
    if magic != 0x00000803 or len(raw) < 16 + count * rows * cols:
        raise ValueError(f"{path}: not an idx3 image file of {count} x {rows} x {cols}")
    size = rows * cols
    return [GreyImage(raw[16 + i * size : 16 + (i + 1) * size], rows, cols) for i in range(count)]


def read_shakespeare(data_dir: Path | None) -> list[str]:
    """Prompts sliced from the Tiny Shakespeare validation text: a speech's first lines, at most 400 chars.

    Each prompt starts at a speaker line (``NAME:``) and ends at a line end, so the model continues a speech.
    """
    path = data_dir / "tinyshakespeare" / "validation.txt" if data_dir else None
    if path is None or not path.is_file():
        return []
    prompts = []
    for speech in path.read_text(encoding="utf-8").split("\n\n"):
        lines = speech.strip("\n").split("\n")
        if len(lines) < 2 or not lines[0].endswith(":"):
            continue
        prompt = ""
        for line in lines[:4]:
            if len(prompt) + len(line) + 1 > MAX_PROMPT_CHARS:
                break
            prompt += line + "\n"
        if prompt.count("\n") >= 2:
            prompts.append(prompt)
    return prompts


def fit_prompt(prompt: str, max_chars: int) -> str:
    """``prompt`` cut to at most ``max_chars`` at a line end, else at a word boundary (never blank)."""
    if len(prompt) <= max_chars:
        return prompt
    head = prompt[:max_chars]
    cut = head.rfind("\n")
    if cut > 0 and head[: cut + 1].count("\n") >= 2:
        return head[: cut + 1]
    cut = head.rfind(" ")
    cut = cut if cut > 0 else max_chars
    return head[:cut].rstrip() or prompt[: max(1, max_chars)]


# --------------------------------------------------------------------------------------------------------
# Built-in samples for a machine without the data directory.

FALLBACK_TRANSLATE = [
    "A man is riding a bicycle down the street.",
    "Two young children are playing in the sand at the beach.",
    "A woman in a red coat is walking her dog in the park.",
    "A group of people are standing in front of a building.",
    "A little girl is climbing a wooden ladder.",
    "A brown dog is running through the grass.",
    "Several men in hard hats are operating a large machine.",
    "A musician plays the guitar on a stage.",
]
FALLBACK_SENTIMENT = [
    "a gorgeous , witty , seductive movie .",
    "the film is strictly routine .",
    "an utterly charming and hilarious film",
    "dull , lifeless , and amateurishly assembled",
    "it 's a charming and often affecting journey .",
    "the plot is nothing but boilerplate clichés",
    "a masterpiece four years in the making",
    "too long , too repetitive , and takes way too many years to resolve",
]
FALLBACK_QA = [
    (
        "Which NFL team represented the AFC at Super Bowl 50?",
        "Super Bowl 50 was an American football game to determine the champion of the National Football "
        "League (NFL) for the 2015 season. The American Football Conference (AFC) champion Denver Broncos "
        "defeated the National Football Conference (NFC) champion Carolina Panthers 24-10 to earn their "
        "third Super Bowl title.",
    ),
    (
        "Where did Super Bowl 50 take place?",
        "The game was played on February 7, 2016, at Levi's Stadium in the San Francisco Bay Area at "
        "Santa Clara, California.",
    ),
    (
        "What is the capital of Normandy?",
        "The Normans were the people who in the 10th and 11th centuries gave their name to Normandy, a "
        "region in France. Rouen is the capital of Normandy.",
    ),
    (
        "When was the university founded?",
        "The university was founded in 1890 by John D. Rockefeller and is located in Chicago, Illinois.",
    ),
]
FALLBACK_ENTITIES = [
    "EU rejects German call to boycott British lamb.",
    "Peter Blackburn reported from Brussels on Thursday.",
    "Angela Merkel visited Paris to meet Emmanuel Macron.",
    "Leicestershire beat Somerset by an innings at Grace Road.",
    "Microsoft opened a new office in Berlin, Germany.",
    "The United Nations said on Monday that aid had reached Sarajevo.",
]
FALLBACK_PROMPTS = [
    "ROMEO:\nBut soft, what light through yonder window breaks?\n",
    "KING RICHARD II:\nLet's talk of graves, of worms and epitaphs;\n",
    "First Citizen:\nBefore we proceed any further, hear me speak.\n",
    "ISABELLA:\nI have no tongue but one: gentle my lord,\n",
    "MENENIUS:\nWhat work's, my countrymen, in hand? where go you\n",
    "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?\n",
]


def fallback_images(n: int = 8) -> list[GreyImage]:
    """Synthetic 28x28 garments: a bright noisy block on black, in the Fashion-MNIST style."""
    rng = random.Random(0)
    images = []
    for _ in range(n):
        top, left, bottom, right = (
            rng.randint(2, 7),
            rng.randint(2, 7),
            rng.randint(20, 26),
            rng.randint(20, 26),
        )
        level = rng.randint(80, 224)
        pixels = bytes(
            min(255, (level if top <= y < bottom and left <= x < right else 0) + rng.randint(0, 30))
            for y in range(28)
            for x in range(28)
        )
        images.append(GreyImage(pixels))
    return images


def png_bytes(image: GreyImage) -> bytes:
    """A grey-scale PNG (colour type 0, 8 bits, no filtering) of ``image``."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    w = image.width
    rows = b"".join(b"\x00" + image.pixels[y * w : (y + 1) * w] for y in range(image.height))
    header = struct.pack(">IIBBBBB", w, image.height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def png_base64(image: GreyImage) -> str:
    return base64.b64encode(png_bytes(image)).decode("ascii")


# --------------------------------------------------------------------------------------------------------


@dataclass
class Inputs:
    """Every input the users draw from; ``sources`` names where each set came from (a path, or "built-in")."""

    translate: list[str]
    sentiment: list[str]
    qa: list[tuple[str, str]]
    entities: list[str]
    images: list[GreyImage]
    prompts: list[str]
    data_dir: Path | None
    sources: dict[str, str] = field(default_factory=dict)

    def pool(self, size: int, seed: int = 0) -> Inputs:
        """A small fixed subset (the same on every worker and run): the cache-warm mix."""

        def pick(items: list) -> list:
            order = random.Random(seed).sample(range(len(items)), k=min(size, len(items)))
            return [items[i] for i in order]

        return Inputs(
            translate=pick(self.translate),
            sentiment=pick(self.sentiment),
            qa=pick(self.qa),
            entities=pick(self.entities),
            images=pick(self.images),
            prompts=pick(self.prompts),
            data_dir=self.data_dir,
            sources=dict(self.sources),
        )

    def counts(self) -> dict[str, int]:
        return {
            "translate": len(self.translate),
            "sentiment": len(self.sentiment),
            "qa": len(self.qa),
            "entities": len(self.entities),
            "images": len(self.images),
            "prompts": len(self.prompts),
        }


def load_inputs(data_dir: str | os.PathLike[str] | None = None) -> Inputs:
    """Read every validation set under the data directory; built-in samples for any that is missing."""
    root = resolve_data_dir(data_dir)
    sources: dict[str, str] = {}

    def choose(name: str, real: list, fallback: list, rel: str) -> list:
        if real:
            sources[name] = str(root / rel) if root else "built-in"
            return real
        sources[name] = "built-in"
        return list(fallback)

    images = choose(
        "images", read_fashion_mnist(root), fallback_images(), "fashion_mnist/validation-images-idx3-ubyte.gz"
    )
    return Inputs(
        translate=choose("translate", read_multi30k(root), FALLBACK_TRANSLATE, "multi30k/validation.en.gz"),
        sentiment=choose("sentiment", read_sst2(root), FALLBACK_SENTIMENT, "sst2/validation.tsv"),
        qa=choose("qa", read_squad(root), FALLBACK_QA, "squad/validation.json"),
        entities=choose("entities", read_conll(root), FALLBACK_ENTITIES, "conll2003/validation.txt"),
        images=images,
        prompts=choose("prompts", read_shakespeare(root), FALLBACK_PROMPTS, "tinyshakespeare/validation.txt"),
        data_dir=root,
        sources=sources,
    )
