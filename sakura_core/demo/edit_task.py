"""The demo model's editing task, generated procedurally from images that ship with scikit-image.

One example is a (template, user image, target) triple, all ``image_size`` square RGB uint8:

* **scene**: a random crop of a sample photo (or a tinted greyscale sample), flipped at random, with a few
  procedural shapes composited on it;
* **template**: the scene with a rectangular region painted in the marker colour (magenta) — "put it here";
* **user image**: content to place, a crop of another sample (or an LFW face), given full-frame and aligned with the
  template (pixel (y, x) of the user image belongs at pixel (y, x) of the result);
* **target**: the scene outside the region; inside it the user content, recoloured to fit: each channel is shifted
  by ``harmonise_strength * (mean of the scene ring around the region - mean of the user content in the region)``.

The model sees the template only through its KV (template tokens attend only to themselves), so both where to
composite and how to recolour must be read from the template's keys and values. Regions are aligned to the token
grid (``align_px``), so every token is either inside or outside.

Everything is a pure function of ``(seed, index)``: :func:`make_pair` regenerates any example, and a different seed
gives a disjoint held-out stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "task_for",
    "DEMO_REGION",
    "EDIT_PROMPT",
    "EditPair",
    "EditTaskConfig",
    "ImageBank",
    "compose_target",
    "demo_template",
    "make_batch",
    "make_pair",
    "mark_template",
    "region_mask",
]

EDIT_PROMPT = "place it in the marked region"

# Region of the demo template (y0, x0, y1, x1) in pixels of a 64 px image: the astronaut's face.
DEMO_REGION = (12, 12, 40, 52)

# scikit-image samples that load offline (no pooch download). Colour photos, then greyscale ones (tinted on use).
_COLOUR_SOURCES = (
    "astronaut",
    "coffee",
    "chelsea",
    "rocket",
    "hubble_deep_field",
    "immunohistochemistry",
    "retina",
    "colorwheel",
    "stereo_motorcycle",
)
_GREY_SOURCES = ("camera", "coins", "moon", "page", "brick", "grass", "gravel", "clock", "cell", "text")


@dataclass(frozen=True)
class EditTaskConfig:
    """Geometry and appearance of the generated edits.

    Attributes:
        image_size: side of every image in pixels.
        align_px: region corners are multiples of this (the model's patch size: regions cover whole tokens).
        region_min_px, region_max_px: region height/width range in pixels (multiples of ``align_px``).
        ring_px: width of the scene band around the region whose mean colour the content is recoloured towards.
        harmonise_strength: 0 = paste the user content as is, 1 = match the ring's mean colour exactly.
        marker_rgb: fill colour of the region in the template.
        face_prob: probability that the user content is an LFW face (greyscale, tinted) instead of a photo crop.
        max_shapes: up to this many procedural shapes are composited on the scene (and on the user content).
        crop_min_frac: smallest crop side as a fraction of the source image's shorter side.
    """

    image_size: int = 64
    align_px: int = 4
    region_min_px: int = 20
    region_max_px: int = 40
    ring_px: int = 8
    harmonise_strength: float = 0.7
    marker_rgb: tuple[int, int, int] = (255, 0, 255)
    face_prob: float = 0.25
    max_shapes: int = 3
    crop_min_frac: float = 0.3

    def __post_init__(self) -> None:
        if self.image_size <= 0 or self.align_px <= 0 or self.image_size % self.align_px:
            raise ValueError(f"image_size {self.image_size} must be a positive multiple of align_px {self.align_px}")
        for name in ("region_min_px", "region_max_px"):
            value = getattr(self, name)
            if value % self.align_px or not 0 < value <= self.image_size:
                raise ValueError(f"{name}={value} must be a multiple of align_px {self.align_px} in (0, image_size]")
        if self.region_min_px > self.region_max_px:
            raise ValueError(f"region_min_px {self.region_min_px} > region_max_px {self.region_max_px}")
        if self.ring_px < 1:
            raise ValueError(f"ring_px must be >= 1, got {self.ring_px}")
        if not 0.0 <= self.harmonise_strength <= 1.0:
            raise ValueError(f"harmonise_strength must be in [0, 1], got {self.harmonise_strength}")
        if not 0.0 <= self.face_prob <= 1.0:
            raise ValueError(f"face_prob must be in [0, 1], got {self.face_prob}")
        if not 0.0 < self.crop_min_frac <= 1.0:
            raise ValueError(f"crop_min_frac must be in (0, 1], got {self.crop_min_frac}")
        if len(self.marker_rgb) != 3 or not all(0 <= c <= 255 for c in self.marker_rgb):
            raise ValueError(f"marker_rgb must be three values in 0..255, got {self.marker_rgb}")


@dataclass
class EditPair:
    """One generated example (all images (S, S, 3) uint8).

    Attributes:
        template: the scene with the region filled with the marker colour.
        user: the content to place, aligned with the template.
        target: the ground truth edit.
        scene: the scene before marking (what the template shows outside the region).
        box: region (y0, x0, y1, x1) in pixels, end-exclusive.
        shift_rgb: per-channel colour shift applied to the user content inside the region (0..255 units).
    """

    template: np.ndarray
    user: np.ndarray
    target: np.ndarray
    scene: np.ndarray
    box: tuple[int, int, int, int]
    shift_rgb: np.ndarray = field(default_factory=lambda: np.zeros(3))


class ImageBank:
    """The source images, loaded once per run and downscaled (shorter side ``max_side``) to keep crops cheap.

    Attributes:
        colour: RGB uint8 sources (H, W, 3).
        grey: greyscale uint8 sources (H, W).
        faces: (N, 25, 25) uint8 LFW faces (the face half of ``skimage.data.lfw_subset``).
    """

    def __init__(self, colour: list[np.ndarray], grey: list[np.ndarray], faces: np.ndarray):
        if not colour:
            raise ValueError("ImageBank needs at least one colour source image")
        self.colour = colour
        self.grey = grey
        self.faces = faces

    @classmethod
    def load(cls, max_side: int = 192) -> ImageBank:
        import skimage.data

        def shrink(arr: np.ndarray) -> np.ndarray:
            from PIL import Image

            h, w = arr.shape[:2]
            scale = max_side / min(h, w)
            if scale >= 1:
                return arr
            size = (max(1, round(w * scale)), max(1, round(h * scale)))
            return np.asarray(Image.fromarray(arr).resize(size, Image.Resampling.BILINEAR))

        colour = []
        for name in _COLOUR_SOURCES:
            arr = getattr(skimage.data, name)()
            if isinstance(arr, tuple):  # stereo_motorcycle: (left, right, disparity)
                arr = arr[0]
            colour.append(shrink(np.ascontiguousarray(arr[..., :3])))
        grey = []
        for name in _GREY_SOURCES:
            arr = getattr(skimage.data, name)()
            grey.append(shrink(arr.astype(np.uint8) if arr.dtype == np.uint8 else _to_uint8(arr)))
        faces = _to_uint8(skimage.data.lfw_subset()[:100])  # the first 100 images of the subset are faces
        return cls(colour, grey, faces)

    @property
    def num_sources(self) -> int:
        return len(self.colour) + len(self.grey)


def _to_uint8(arr: np.ndarray) -> np.ndarray:
    arr = np.asarray(arr, dtype=np.float64)
    if arr.max() <= 1.0:
        arr = arr * 255.0
    return np.clip(np.round(arr), 0, 255).astype(np.uint8)


def _resize(arr: np.ndarray, size: int) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.fromarray(arr).resize((size, size), Image.Resampling.BILINEAR))


def _tint(grey: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Greyscale (H, W) -> RGB by a random two-colour gradient map (dark colour -> light colour)."""
    dark = rng.uniform(0, 110, size=3)
    light = rng.uniform(140, 255, size=3)
    g = grey.astype(np.float32)[..., None] / 255.0  # (H, W, 1)
    return np.clip(np.round(dark + g * (light - dark)), 0, 255).astype(np.uint8)


def _source(bank: ImageBank, idx: int, rng: np.random.Generator) -> np.ndarray:
    if idx < len(bank.colour):
        return bank.colour[idx]
    return _tint(bank.grey[idx - len(bank.colour)], rng)


def _random_crop(src: np.ndarray, size: int, cfg: EditTaskConfig, rng: np.random.Generator) -> np.ndarray:
    h, w = src.shape[:2]
    short = min(h, w)
    side = max(8, int(round(short * rng.uniform(cfg.crop_min_frac, 1.0))))
    y = int(rng.integers(0, h - side + 1))
    x = int(rng.integers(0, w - side + 1))
    out = _resize(np.ascontiguousarray(src[y : y + side, x : x + side]), size)
    return out[:, ::-1].copy() if rng.random() < 0.5 else out


def _near_marker(rgb: np.ndarray, marker: tuple[int, int, int]) -> bool:
    return float(np.abs(rgb - np.asarray(marker, dtype=np.float64)).max()) < 80


def _add_shapes(img: np.ndarray, cfg: EditTaskConfig, rng: np.random.Generator) -> np.ndarray:
    """Composite 0..max_shapes random ellipses, rectangles and triangles (random colour, alpha 0.6..1)."""
    from PIL import Image, ImageDraw

    n = int(rng.integers(0, cfg.max_shapes + 1))
    if n == 0:
        return img
    s = cfg.image_size
    base = Image.fromarray(img).convert("RGBA")
    for _ in range(n):
        colour = rng.integers(0, 256, size=3)
        while _near_marker(colour, cfg.marker_rgb):
            colour = rng.integers(0, 256, size=3)
        alpha = int(rng.uniform(0.6, 1.0) * 255)
        layer = Image.new("RGBA", (s, s), (0, 0, 0, 0))
        draw = ImageDraw.Draw(layer)
        cx, cy = rng.uniform(0, s, size=2)
        rx, ry = rng.uniform(s * 0.06, s * 0.25, size=2)
        fill = (int(colour[0]), int(colour[1]), int(colour[2]), alpha)
        kind = int(rng.integers(0, 3))
        if kind == 0:
            draw.ellipse([cx - rx, cy - ry, cx + rx, cy + ry], fill=fill)
        elif kind == 1:
            draw.rectangle([cx - rx, cy - ry, cx + rx, cy + ry], fill=fill)
        else:
            pts = [(float(cx + rx * np.cos(a)), float(cy + ry * np.sin(a))) for a in rng.uniform(0, 2 * np.pi, 3)]
            draw.polygon(pts, fill=fill)
        base = Image.alpha_composite(base, layer)
    return np.asarray(base.convert("RGB"))


def _random_box(cfg: EditTaskConfig, rng: np.random.Generator) -> tuple[int, int, int, int]:
    a, s = cfg.align_px, cfg.image_size
    lo, hi = cfg.region_min_px // a, cfg.region_max_px // a
    h = int(rng.integers(lo, hi + 1)) * a
    w = int(rng.integers(lo, hi + 1)) * a
    y0 = int(rng.integers(0, (s - h) // a + 1)) * a
    x0 = int(rng.integers(0, (s - w) // a + 1)) * a
    return (y0, x0, y0 + h, x0 + w)


def region_mask(box: tuple[int, int, int, int], size: int) -> np.ndarray:
    """(size, size) bool, True inside ``box`` = (y0, x0, y1, x1), end-exclusive."""
    y0, x0, y1, x1 = box
    if not (0 <= y0 < y1 <= size and 0 <= x0 < x1 <= size):
        raise ValueError(f"region box {box} must satisfy 0 <= y0 < y1 <= {size} and 0 <= x0 < x1 <= {size}")
    mask = np.zeros((size, size), dtype=bool)
    mask[y0:y1, x0:x1] = True
    return mask


def mark_template(scene: np.ndarray, box: tuple[int, int, int, int], cfg: EditTaskConfig) -> np.ndarray:
    """The scene with ``box`` filled with the marker colour."""
    out = np.array(scene, dtype=np.uint8, copy=True)
    out[region_mask(box, out.shape[0])] = cfg.marker_rgb
    return out


def compose_target(
    scene: np.ndarray, user: np.ndarray, box: tuple[int, int, int, int], cfg: EditTaskConfig
) -> tuple[np.ndarray, np.ndarray]:
    """Ground truth: scene outside ``box``, user content recoloured towards the surrounding ring inside it.

    Returns (target (S, S, 3) uint8, shift_rgb (3,) float): ``shift = strength * (mean(ring) - mean(user in box))``
    per channel, the ring being the scene pixels within ``ring_px`` of the box (Chebyshev distance), outside it.
    """
    s = scene.shape[0]
    if scene.shape != (s, s, 3) or user.shape != scene.shape:
        raise ValueError(f"scene and user must both be (S, S, 3), got {scene.shape} and {user.shape}")
    y0, x0, y1, x1 = box
    inside = region_mask(box, s)
    r = cfg.ring_px
    grown = region_mask((max(0, y0 - r), max(0, x0 - r), min(s, y1 + r), min(s, x1 + r)), s)
    ring = grown & ~inside
    if not ring.any():  # the region covers the whole image: nothing to harmonise with
        ring_mean = user[inside].astype(np.float64).mean(axis=0)
    else:
        ring_mean = scene[ring].astype(np.float64).mean(axis=0)  # (3,)
    shift = cfg.harmonise_strength * (ring_mean - user[inside].astype(np.float64).mean(axis=0))  # (3,)
    target = np.array(scene, dtype=np.uint8, copy=True)
    target[inside] = np.clip(np.round(user[inside].astype(np.float64) + shift), 0, 255).astype(np.uint8)
    return target, shift


def make_pair(bank: ImageBank, cfg: EditTaskConfig, seed: int, index: int) -> EditPair:
    """Example ``index`` of stream ``seed``: a pure function of its arguments (and the bank's images)."""
    if seed < 0 or index < 0:
        raise ValueError(f"seed and index must be >= 0, got seed={seed}, index={index}")
    rng = np.random.default_rng([seed, index])
    s = cfg.image_size
    scene_idx = int(rng.integers(0, bank.num_sources))
    scene = _add_shapes(_random_crop(_source(bank, scene_idx, rng), s, cfg, rng), cfg, rng)
    if len(bank.faces) and rng.random() < cfg.face_prob:
        face = _resize(bank.faces[int(rng.integers(0, len(bank.faces)))], s)
        user = _tint(face, rng)
    else:
        user_idx = int(rng.integers(0, bank.num_sources - 1))
        user_idx += user_idx >= scene_idx  # never the scene's own source
        user = _random_crop(_source(bank, user_idx, rng), s, cfg, rng)
    user = _add_shapes(user, cfg, rng)
    box = _random_box(cfg, rng)
    target, shift = compose_target(scene, user, box, cfg)
    return EditPair(mark_template(scene, box, cfg), user, target, scene, box, shift)


def make_batch(bank: ImageBank, cfg: EditTaskConfig, seed: int, indices) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Examples ``indices`` of stream ``seed`` stacked: (template, user, target), each (B, S, S, 3) uint8."""
    pairs = [make_pair(bank, cfg, seed, int(i)) for i in indices]
    template, user, target = (np.stack([getattr(p, k) for p in pairs]) for k in ("template", "user", "target"))
    return template, user, target


def demo_template(source, cfg: EditTaskConfig | None = None, box: tuple[int, int, int, int] | None = None):
    """A marked template for the demo: a sample name or image path, resized, with ``box`` (default DEMO_REGION,
    scaled to ``cfg.image_size``) painted in the marker colour.

    An image that already contains marker-coloured pixels is taken as marked by its author and left as is.
    """
    from ..models.edit_model import load_image

    cfg = cfg or EditTaskConfig()
    img = load_image(source, cfg.image_size)
    if (img == np.asarray(cfg.marker_rgb, dtype=np.uint8)).all(axis=-1).any():
        return img
    if box is None:
        k = cfg.image_size / 64
        x0, y0, x1, y1 = (int(round(v * k / cfg.align_px)) * cfg.align_px for v in DEMO_REGION)
        box = (x0, y0, x1, y1)
    return mark_template(img, box, cfg)


def task_for(spec) -> EditTaskConfig:
    """The task geometry that fits a model's ``ModelSpec``: same image size, regions aligned to its patches.

    Region sides span 5/16..10/16 of the image and the harmonisation ring 1/8 of it (20..40 px, ring 8 px at 64 px).
    """
    s, a = spec.image_size, spec.patch_size
    lo = max(a, (s * 5 // 16) // a * a)
    hi = max(lo, (s * 10 // 16) // a * a)
    return EditTaskConfig(image_size=s, align_px=a, region_min_px=lo, region_max_px=hi, ring_px=max(1, s // 8))
