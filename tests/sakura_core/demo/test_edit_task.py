"""The generated editing task: deterministic, and its targets are what the construction says."""

import numpy as np
import pytest

from sakura_core.demo.edit_task import (
    DEMO_REGION,
    EditTaskConfig,
    ImageBank,
    compose_target,
    demo_template,
    make_batch,
    make_pair,
    mark_template,
    region_mask,
)

CFG = EditTaskConfig()


@pytest.fixture(scope="module")
def bank():
    return ImageBank.load()


def test_pairs_are_a_pure_function_of_seed_and_index(bank):
    a, b = make_pair(bank, CFG, 3, 17), make_pair(bank, CFG, 3, 17)
    for name in ("template", "user", "target", "scene"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert a.box == b.box
    other_index, other_seed = make_pair(bank, CFG, 3, 18), make_pair(bank, CFG, 4, 17)
    assert not np.array_equal(a.target, other_index.target)
    assert not np.array_equal(a.target, other_seed.target)
    templates, users, targets = make_batch(bank, CFG, 3, [17, 18])
    assert templates.shape == (2, 64, 64, 3) and templates.dtype == np.uint8
    assert np.array_equal(targets[0], a.target) and np.array_equal(users[1], other_index.user)


def test_generated_pairs_follow_the_construction(bank):
    marker = np.array(CFG.marker_rgb, dtype=np.uint8)
    for i in range(12):
        p = make_pair(bank, CFG, 0, i)
        y0, x0, y1, x1 = p.box
        assert all(v % CFG.align_px == 0 for v in p.box)
        assert CFG.region_min_px <= y1 - y0 <= CFG.region_max_px and CFG.region_min_px <= x1 - x0 <= CFG.region_max_px
        inside = region_mask(p.box, 64)
        # template: marker exactly inside the region, scene outside; the scene itself never shows the marker
        assert (p.template[inside] == marker).all()
        assert np.array_equal(p.template[~inside], p.scene[~inside])
        assert not (p.scene == marker).all(axis=-1).any()
        # target: scene outside, user content shifted by one colour per channel inside
        assert np.array_equal(p.target[~inside], p.scene[~inside])
        expected = np.clip(np.round(p.user[inside].astype(float) + p.shift_rgb), 0, 255)
        assert np.array_equal(p.target[inside], expected.astype(np.uint8))


def test_harmonisation_matches_hand_computed_ring_colour():
    cfg = EditTaskConfig(harmonise_strength=0.5, ring_px=4)
    scene = np.zeros((64, 64, 3), np.uint8)
    scene[:] = (200, 0, 0)  # far from the region: must not count
    scene[16:40, 16:40] = (100, 150, 200)  # the ring (4 px around the box) lies inside this square
    user = np.full((64, 64, 3), 60, np.uint8)
    user[:20] = 255  # outside the region: must not count in the user's mean
    box = (20, 20, 36, 36)
    target, shift = compose_target(scene, user, box, cfg)
    # shift = 0.5 * (ring mean - user mean in the box) = 0.5 * ((100, 150, 200) - 60)
    np.testing.assert_allclose(shift, [20.0, 45.0, 70.0])
    assert (target[20:36, 20:36] == (80, 105, 130)).all()
    assert np.array_equal(target[:20], scene[:20]) and np.array_equal(target[36:], scene[36:])
    unharmonised, zero = compose_target(scene, user, box, EditTaskConfig(harmonise_strength=0.0))
    assert (unharmonised[20:36, 20:36] == 60).all() and not zero.any()


def test_demo_template_marks_the_demo_region_once():
    t = demo_template("astronaut")
    inside = region_mask(DEMO_REGION, 64)
    assert (t[inside] == CFG.marker_rgb).all()
    assert not (t[~inside] == CFG.marker_rgb).all(axis=-1).any()
    assert np.array_equal(demo_template(t), t)  # an already marked image is left alone
    assert np.array_equal(mark_template(t, DEMO_REGION, CFG), t)


def test_bad_settings_name_the_value():
    with pytest.raises(ValueError, match="region_max_px"):
        EditTaskConfig(region_max_px=42)
    with pytest.raises(ValueError, match="harmonise_strength"):
        EditTaskConfig(harmonise_strength=1.5)
    with pytest.raises(ValueError, match="region box"):
        region_mask((10, 10, 5, 20), 64)
    with pytest.raises(ValueError, match="seed and index"):
        make_pair(ImageBank([np.zeros((8, 8, 3), np.uint8)], [], np.zeros((0, 25, 25), np.uint8)), CFG, -1, 0)
