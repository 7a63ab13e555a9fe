"""The page is usable on a phone: each of its states (choose, running with progress, result, error), driven as
``tests/phone_web/page_screenshots.py`` drives it for the README's screenshots, fits a 412 px wide viewport without
horizontal scrolling, and each state is the one it claims (the progress bar moving while running, the result done,
the error the page's error state with a message that says what to do)."""

from __future__ import annotations

from .loopback import loopback_server
from .page_driver import PHOTO_NAME, recording_app
from .page_screenshots import STATES, page_states


def test_every_page_state_fits_a_phone_width(page_store, chromium, tmp_path):
    from PIL import Image

    from sakura_core.models.edit_model import load_image

    store, model_dir, model, _ = page_store
    photo = tmp_path / PHOTO_NAME
    Image.fromarray(load_image("chelsea", model.spec.image_size)).save(photo)
    with loopback_server(recording_app(store, model_dir, [])) as base:
        shown = page_states(chromium, base, tmp_path / "img", photo)
    assert tuple(shown) == STATES
    assert [shown[s]["state"] for s in STATES] == ["choose", "running", "done", "error"]
    assert shown["running"]["progress"] >= 2 and shown["running"]["phase"].startswith("fetched")
    for name, s in shown.items():
        assert s["scroll"] <= 412 and s["width"] <= 412, (name, s)  # no horizontal scroll at a phone's width
        with Image.open(s["file"]) as png:
            assert png.size == (412, 915), (name, png.size)
