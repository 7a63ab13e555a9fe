"""Image and token quality metrics, written once: every PSNR in the project comes from here.

Conventions: token tensors and decoded images live in [-1, 1] (peak-to-peak 2); uint8 images in [0, 255]. Identical
inputs have no finite PSNR; each function returns ``cap_db`` for them (100 dB by default, ``math.inf`` where a caller
needs to tell "identical" apart).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["DEFAULT_CAP_DB", "psnr_from_mse", "psnr_tokens", "psnr_uint8"]

DEFAULT_CAP_DB = 100.0


def psnr_from_mse(mse: float, peak: float = 2.0, cap_db: float = DEFAULT_CAP_DB) -> float:
    """PSNR in dB of a mean squared error ``mse`` for signals with peak-to-peak range ``peak`` (2 for [-1, 1]).

    Returns ``cap_db`` when the error is at or below what ``cap_db`` would mean (identical inputs included).
    """
    if mse < 0 or math.isnan(mse):
        raise ValueError(f"mse must be a non-negative number, got {mse}")
    if mse <= peak * peak * 10 ** (-cap_db / 10):
        return cap_db
    return min(cap_db, 10 * math.log10(peak * peak / mse))


def psnr_tokens(a, b, cap_db: float = DEFAULT_CAP_DB) -> float:
    """PSNR of two torch tensors with values in [-1, 1] (clamped to that range first)."""
    mse = float(((a.double().clamp(-1, 1) - b.double().clamp(-1, 1)) ** 2).mean())
    return psnr_from_mse(mse, 2.0, cap_db)


def psnr_uint8(a: np.ndarray, b: np.ndarray, cap_db: float = DEFAULT_CAP_DB) -> float:
    """PSNR of two uint8 images (or any arrays on a 0-255 scale)."""
    mse = float(np.mean((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2))
    return psnr_from_mse(mse, 255.0, cap_db)
