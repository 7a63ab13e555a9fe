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


def test_small_transfers_are_pooled_into_one_sample_once_they_reach_the_minimum():
    e = ThroughputEstimator(EstimatorConfig(min_sample_bytes=1000))
    e.observe(400, 0.1)
    e.observe(400, 0.3)
    assert e.samples == 0 and e.harmonic() == EstimatorConfig().prior_bytes_per_s  # 800 B: not yet a sample
    e.observe(400, 0.2)
    assert e.samples == 1 and e.harmonic() == pytest.approx(1200 / 0.6)  # the pool: its bytes over its time
    e.observe(5000, 1.0)  # a large transfer is a sample of its own
    assert e.samples == 2 and e.harmonic() == pytest.approx(2 / (0.6 / 1200 + 1 / 5000))
    e.observe(0, 0.5)  # an empty transfer tells nothing
    e.reset()
    e.observe(999, 0.1)
    assert e.samples == 0  # reset emptied the pool too


def test_config_is_validated():
    with pytest.raises(ValueError, match="window must be >= 1"):
        EstimatorConfig(window=0)
