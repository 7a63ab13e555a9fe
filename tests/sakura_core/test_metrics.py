"""PSNR written once: hand-derived values, the cap, bad input."""

import math

import numpy as np
import pytest
import torch

from sakura_core.metrics import psnr_from_mse, psnr_tokens, psnr_uint8


def test_psnr_from_mse_hand_values():
    assert psnr_from_mse(0.04) == pytest.approx(20.0)  # [-1, 1]: 10*log10(4 / 0.04) = 20
    assert psnr_from_mse(1.0, peak=255.0) == pytest.approx(20 * math.log10(255))
    assert psnr_from_mse(0.0) == 100.0
    assert psnr_from_mse(0.0, cap_db=math.inf) == math.inf
    assert psnr_from_mse(4e-11) == 100.0  # just at the cap
    with pytest.raises(ValueError, match="non-negative"):
        psnr_from_mse(-1.0)


def test_psnr_tokens_clamps_to_the_signal_range():
    a = torch.zeros(1, 4, 3)
    b = torch.full((1, 4, 3), 0.2)
    assert psnr_tokens(a, b) == pytest.approx(10 * math.log10(4 / 0.04))
    assert psnr_tokens(a + 5, torch.ones(1, 4, 3)) == 100.0  # 5 clamps to 1: identical after clamping


def test_psnr_uint8_matches_the_definition():
    a = np.zeros((4, 4, 3), np.uint8)
    b = a.copy()
    b[0, 0, 0] = 48  # mse = 48^2 / 48 = 48
    assert psnr_uint8(a, b) == pytest.approx(10 * math.log10(255**2 / 48))
    assert psnr_uint8(a, a) == 100.0
