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


def test_a_transfer_before_the_lanes_seeds_a_sample_with_its_round_trip_taken_off():
    e = ThroughputEstimator(EstimatorConfig(min_sample_bytes=1000))
    e.seed(200_000, 1.1, 0.1)  # one round trip, then 1 s of bytes
    assert e.samples == 1 and e.harmonic() == pytest.approx(200_000 / 1.0)
    assert e.robust() == e.harmonic()  # no lane sample yet: no error to discount by
    e.observe(100_000, 1.0)  # the lanes' first sample: half the seed, its error counts in robust()
    assert e.robust() == pytest.approx(e.harmonic() / (1 + abs(200_000 - 100_000) / 100_000))


def test_a_seed_mostly_round_trip_is_bounded_at_twice_its_raw_rate():
    e = ThroughputEstimator(EstimatorConfig(min_sample_bytes=1000))
    e.seed(50_000, 0.11, 0.1)  # 10 ms of bytes after a 100 ms round trip: 5 MB/s would be latency's guess
    assert e.harmonic() == pytest.approx(50_000 / 0.055)  # the round trip taken off half the time at most
    tight = ThroughputEstimator(EstimatorConfig(min_sample_bytes=1000, seed_rtt_share=0.0))
    tight.seed(50_000, 0.11, 0.1)
    assert tight.harmonic() == pytest.approx(50_000 / 0.11)  # share 0: the raw rate, round trip and all


def test_a_small_seed_is_a_sample_of_its_own_and_an_empty_one_is_nothing():
    e = ThroughputEstimator(EstimatorConfig(min_sample_bytes=10_000))
    e.seed(0, 1.0, 0.05)
    e.seed(4_000, 0.0, 0.05)
    assert e.samples == 0
    e.seed(4_000, 0.2, 0.05)  # the manifest: below the lanes' minimum, a sample all the same (its round trip off)
    assert e.samples == 1 and e.harmonic() == pytest.approx(4_000 / 0.15)
    e.observe(3_000, 0.1)  # a lane's small shard still pools
    assert e.samples == 1
    e.seed(8_000, 0.45, 0.05)  # a seed after it takes the pool with it
    assert e.samples == 2 and e.robust() < e.harmonic()
    assert 2 / e.harmonic() == pytest.approx(0.15 / 4_000 + (0.1 + 0.4) / 11_000)
    e.reset()
    assert e.samples == 0  # a reset forgets the seed


def test_the_seed_share_is_validated():
    with pytest.raises(ValueError, match="seed_rtt_share must be in"):
        EstimatorConfig(seed_rtt_share=1.0)
