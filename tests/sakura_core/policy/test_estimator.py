import pytest

from sakura_core.policy.estimator import EstimatorConfig, ThroughputEstimator


def test_harmonic_mean_and_error_discount():
    e = ThroughputEstimator(EstimatorConfig(window=3, min_sample_bytes=1))
    assert e.harmonic() == EstimatorConfig().prior_bytes_per_s
    e.observe(100, 1.0)  # 100 B/s
    e.observe(300, 1.0)  # 300 B/s; prediction was 100 -> error |100-300|/300
    assert e.harmonic() == pytest.approx(2 / (1 / 100 + 1 / 300))
    assert e.robust() == pytest.approx(e.harmonic() / (1 + 2 / 3))
    for _ in range(3):
        e.observe(200, 1.0)
    assert e.harmonic() == pytest.approx(200)  # window of 3 forgot the old samples


def test_small_transfers_are_not_samples():
    e = ThroughputEstimator(EstimatorConfig(min_sample_bytes=1000))
    e.observe(10, 0.001)
    assert e.samples == 0


def test_config_is_validated():
    with pytest.raises(ValueError, match="window must be >= 1"):
        EstimatorConfig(window=0)
