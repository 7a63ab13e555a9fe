"""Images from outside are decoded with a pixel limit and converted by their mode (issue 28): a 16-bit greyscale PNG
is scaled (PIL's convert("RGB") clipped it to black and white), palette and CMYK images convert, a decompression
bomb and a file that is not an image are refused with an ImageError that says which."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from sakura_core.images import ImageError, ImageLimitError, decode_image, open_image_file, to_uint8
from sakura_core.limits import LimitError
from sakura_core.models.edit_model import load_image


def _png(img: Image.Image, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt)
    return buf.getvalue()


def _grey16() -> tuple[bytes, np.ndarray]:
    ramp = np.linspace(0, 65535, 64 * 64).reshape(64, 64).astype(np.uint16)  # (H, W) a ramp over the 16-bit range
    return _png(Image.fromarray(ramp)), ramp


def test_a_16_bit_greyscale_png_is_scaled_not_clipped():
    data, ramp = _grey16()
    clipped = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))  # the defect: what every reader used to do
    assert (clipped == 255).mean() > 0.99  # every value over 255 clipped to white
    rgb, fmt = decode_image(data)
    assert fmt == "PNG" and rgb.shape == (64, 64, 3) and rgb.dtype == np.uint8
    expected = np.rint(ramp / 257.0)  # hand-derived: 16-bit v -> 8-bit v / 257, rounded
    assert np.abs(rgb[..., 0].astype(int) - expected).max() <= 1 and (rgb[..., 0] == rgb[..., 2]).all()
    assert rgb[0, 0, 0] == 0 and rgb[-1, -1, 0] == 255 and len(np.unique(rgb)) > 200


def test_load_image_of_a_16_bit_file_and_array(tmp_path):
    data, ramp = _grey16()
    (tmp_path / "g16.png").write_bytes(data)
    assert open_image_file(tmp_path / "g16.png")[-1, -1, 0] == 255
    out = load_image(str(tmp_path / "g16.png"), 64)
    assert abs(int(out[32, 32, 0]) - round(ramp[32, 32] / 257)) <= 2
    assert to_uint8(np.array([0, 257, 65535], np.uint16)).tolist() == [0, 1, 255]


def test_palette_and_cmyk_images_convert_by_their_colours():
    colours = np.array([[255, 0, 0], [0, 0, 255]], np.uint8)
    idx = np.zeros((16, 16), np.uint8)
    idx[:, 8:] = 1
    pal = Image.fromarray(idx, mode="P")
    pal.putpalette(colours.flatten().tolist())
    rgb, _ = decode_image(_png(pal))
    assert rgb[0, 0].tolist() == [255, 0, 0] and rgb[0, 15].tolist() == [0, 0, 255]
    cmyk = Image.new("CMYK", (16, 16), (0, 255, 255, 0))  # full magenta + yellow = red
    rgb, fmt = decode_image(_png(cmyk, "JPEG"))
    assert fmt == "JPEG" and rgb[8, 8, 0] > 200 and rgb[8, 8, 1] < 60 and rgb[8, 8, 2] < 60


def _bomb_png(side: int) -> bytes:
    """A PNG whose header declares side x side greyscale pixels, with one tiny compressed row (a bomb's header)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)  # 8-bit greyscale
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 1024)) + chunk(b"IEND", b"")
    )


def test_a_decompression_bomb_is_refused_from_its_header():
    bomb = _bomb_png(10_000)  # 100 M pixels declared in ~100 bytes
    assert len(bomb) < 200
    with pytest.raises(ImageLimitError, match=r"is 10000x10000 = 100000000 pixels, over the limit of 1000000"):
        decode_image(bomb, "template image", max_pixels=1_000_000)
    with pytest.raises(LimitError, match="over the limit of 67108864"):
        decode_image(bomb)
    with pytest.raises(ImageLimitError, match="could be decompression bomb"):  # past PIL's own limit too
        decode_image(_bomb_png(20_000), "template image")
    with pytest.raises(ImageLimitError, match="is 2000 bytes, over the limit of 1000"):
        decode_image(b"\0" * 2000, max_bytes=1000)


@pytest.mark.parametrize("data", [b"not an image at all", b"\x89PNG\r\n\x1a\n" + b"\0" * 40, b""])
def test_a_non_image_is_refused_clearly(data):
    with pytest.raises(ImageError, match=r"^template image is not a readable image \(PNG, JPEG, WebP, \.\.\.\)"):
        decode_image(data, "template image")


def test_a_truncated_image_is_refused_clearly():
    data = _png(Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), np.uint8)))
    with pytest.raises(ImageError, match="is not a readable image"):
        decode_image(data[: len(data) // 2])
