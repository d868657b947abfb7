"""Images: decode PNG/JPEG of any size and mode, convert and normalise exactly as in training."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, UnidentifiedImageError

from service.engine.manifest import Preprocessing

RESAMPLE = {
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "nearest": Image.Resampling.NEAREST,
}


class ImageDecodeError(ValueError):
    pass


def open_image(data: bytes, max_pixels: int) -> Image.Image:
    """The image with only its header read: a PNG or JPEG of at most ``max_pixels``, else ImageDecodeError.

    The pixel count is checked from the header before any pixel is decoded,
    so a decompression bomb is refused, not expanded.
    """
    try:
        image = Image.open(io.BytesIO(data))
        if image.format not in ("PNG", "JPEG"):
            raise ImageDecodeError(f"unsupported image format {image.format}: send PNG or JPEG")
        width, height = image.size
        if width * height > max_pixels:
            raise ImageDecodeError(f"image has {width}x{height} pixels, more than the limit of {max_pixels}")
    except ImageDecodeError:
        raise
    except UnidentifiedImageError as exc:
        raise ImageDecodeError("could not decode the image: not a PNG or JPEG file") from exc
    except Image.DecompressionBombError as exc:  # Pillow's own guard, for headers far past any limit
        raise ImageDecodeError(f"image has more pixels than the limit of {max_pixels}: {exc}") from exc
    except Exception as exc:  # PIL raises many types for broken data
        raise ImageDecodeError(f"could not decode the image: {exc}") from exc
    return image


def decode_image(data: bytes, preprocessing: Preprocessing, max_pixels: int) -> np.ndarray:
    """Bytes -> uint8 array (H, W) or (H, W, C) in the model's colour mode and size (``open_image``'s checks
    first)."""
    return image_pixels(open_image(data, max_pixels), preprocessing)


def image_pixels(image: Image.Image, preprocessing: Preprocessing) -> np.ndarray:
    """An opened image (``open_image``) decoded: uint8 (H, W) or (H, W, C) in the model's mode and size."""
    try:
        image.load()
    except Exception as exc:  # PIL raises many types for broken data
        raise ImageDecodeError(f"could not decode the image: {exc}") from exc
    if image.mode in ("RGBA", "LA", "P"):  # flatten transparency onto black, the training background
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (0, 0, 0, 255))
        image = Image.alpha_composite(background, rgba)
    image = image.convert(preprocessing.color_mode)
    target_h, target_w = preprocessing.image_size
    if image.size != (target_w, target_h):
        image = image.resize((target_w, target_h), RESAMPLE[preprocessing.resample])
    return np.asarray(image, dtype=np.uint8)


def to_pixel_values(images: np.ndarray, preprocessing: Preprocessing) -> np.ndarray:
    """uint8 (N, H, W[, C]) -> float32 (N, C, H, W), scaled and normalised with the training statistics."""
    x = images.astype(np.float32) * np.float32(preprocessing.scale)
    x = x[:, None, :, :] if x.ndim == 3 else x.transpose(0, 3, 1, 2)
    mean = np.asarray(preprocessing.mean, dtype=np.float32)[None, :, None, None]
    std = np.asarray(preprocessing.std, dtype=np.float32)[None, :, None, None]
    return (x - mean) / std
