"""Image decoding for everything that comes from outside (a template image blob, an upload, a file a user names): a
pixel limit checked on the header before any pixel is decoded, and a mode-correct conversion to (H, W, 3) uint8.

PIL's ``convert("RGB")`` clips 16- and 32-bit greyscale to 0..255 (a 16-bit PNG would come out black and white); here
16-bit values are scaled (``v / 257``), palette images go through their palette (with transparency, as RGBA),
CMYK and other modes through PIL's own conversion, and an alpha channel is dropped. A file that is not an image, a
truncated one, or one past the pixel limit raises :class:`ImageError` (a ``ValueError``) that says which.
"""

from __future__ import annotations

import io
import re

import numpy as np

from .limits import MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS, LimitError

__all__ = ["ImageError", "ImageLimitError", "decode_image", "image_to_rgb8", "open_image_file", "to_uint8"]

_OBJECT_REPR = re.compile(r"<[^<>]{1,80} object at 0x[0-9a-fA-F]+>")


class ImageError(ValueError):
    """Bytes that are not a readable image (or not one this can convert)."""


class ImageLimitError(ImageError, LimitError):
    """An image past the pixel or byte limit (a decompression bomb)."""


def to_uint8(arr: np.ndarray) -> np.ndarray:
    """An image array as uint8, scaled by its dtype's range: uint16 / 257, other integers clipped, floats in [0, 1]
    times 255 (floats above 1 are taken as 0..255)."""
    arr = np.asarray(arr)
    if arr.dtype == np.uint8:
        return arr
    if arr.dtype == np.uint16:
        return ((arr.astype(np.uint32) + 128) // 257).astype(np.uint8)  # 65535 -> 255, rounded
    if arr.dtype.kind in "iu":
        return np.clip(arr, 0, 255).astype(np.uint8)
    if arr.dtype.kind == "f":
        arr = np.nan_to_num(arr, nan=0.0, posinf=255.0, neginf=0.0)
        return np.clip(arr * (255.0 if arr.max(initial=0.0) <= 1.0 else 1.0), 0, 255).astype(np.uint8)
    if arr.dtype == np.bool_:
        return arr.astype(np.uint8) * 255
    raise ImageError(f"image array of dtype {arr.dtype} cannot be converted to 8-bit")


def image_to_rgb8(img) -> np.ndarray:
    """A decoded PIL image as (H, W, 3) uint8, mode by mode (see the module docstring)."""
    mode = img.mode
    if mode in ("I;16", "I;16L", "I;16B", "I;16N"):
        grey = to_uint8(np.asarray(img, dtype=np.uint16))  # (H, W)
    elif mode == "I":  # 32-bit ints: a 16-bit PNG opens as this in some Pillow versions
        raw = np.asarray(img, dtype=np.int64)
        grey = to_uint8(np.clip(raw, 0, 65535).astype(np.uint16)) if raw.max(initial=0) > 255 else to_uint8(raw)
    elif mode == "F":
        grey = to_uint8(np.asarray(img, dtype=np.float32))
    elif mode == "1":
        grey = to_uint8(np.asarray(img, dtype=bool))
    else:
        if mode == "P" and "transparency" in img.info:
            img = img.convert("RGBA")
        return np.asarray(img.convert("RGB"))
    return np.repeat(grey[..., None], 3, axis=-1)


def decode_image(
    data: bytes,
    what: str = "image",
    *,
    max_pixels: int = MAX_IMAGE_PIXELS,
    max_bytes: int = MAX_IMAGE_BYTES,
    formats: tuple[str, ...] | None = None,
):
    """``data`` (an encoded image file) as (H, W, 3) uint8 and its PIL format name (``"PNG"``, ...). The size and the
    header's width x height are checked before any pixel is decoded; ``formats``: the formats accepted (None: any)."""
    from PIL import Image, UnidentifiedImageError

    if len(data) > max_bytes:
        raise ImageLimitError(f"{what} is {len(data)} bytes, over the limit of {max_bytes}")
    try:
        with Image.open(io.BytesIO(data)) as img:
            return _decode_opened(img, what, max_pixels, formats), img.format
    except Image.DecompressionBombError as e:  # past PIL's own limit (twice its MAX_IMAGE_PIXELS)
        raise ImageLimitError(f"{what}: {_OBJECT_REPR.sub('the file', str(e))}") from e
    except (UnidentifiedImageError, OSError, SyntaxError, EOFError) as e:
        detail = _OBJECT_REPR.sub("the file", str(e))  # PIL names its file object: <_io.BytesIO object at 0x...>
        raise ImageError(f"{what} is not a readable image (PNG, JPEG, WebP, ...): {detail}") from e


def _decode_opened(img, what: str, max_pixels: int, formats: tuple[str, ...] | None) -> np.ndarray:
    if formats is not None and img.format not in formats:
        raise ImageError(f"{what}: image format {img.format} not accepted: use {', '.join(formats)}")
    w, h = img.size
    if w * h > max_pixels:
        raise ImageLimitError(f"{what} is {w}x{h} = {w * h} pixels, over the limit of {max_pixels}")
    img.load()
    return image_to_rgb8(img)


def open_image_file(path, *, max_pixels: int = MAX_IMAGE_PIXELS, max_bytes: int = MAX_IMAGE_BYTES) -> np.ndarray:
    """An image file on disk as (H, W, 3) uint8 (:func:`decode_image`'s checks; ``ImageError`` names the file)."""
    from pathlib import Path

    path = Path(path)
    size = path.stat().st_size
    if size > max_bytes:
        raise ImageLimitError(f"image {path} is {size} bytes, over the limit of {max_bytes}")
    return decode_image(path.read_bytes(), f"image {path}", max_pixels=max_pixels, max_bytes=max_bytes)[0]
