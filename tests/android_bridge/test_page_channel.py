"""The pairing / job channel between ComfyUI and phone pages (``android_bridge.page_channel.PageHub``) on a fake
clock: codes refused by name (unknown, used, expired), pages chosen by code, a page that goes silent failing its job
within ``stale_after_s``, a page closing, a timeout, a cancel, and concurrent pages each getting only their job."""

from __future__ import annotations

import threading

import pytest

from android_bridge.page_channel import PageChannelError, PageHub, PageHubConfig, PairingError


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _hub(**config) -> tuple[PageHub, Clock]:
    clock = Clock()
    codes = iter(["ABCDEF", "GHJKMN", "PQRSTU", "VWXYZ2"])
    chars: list[str] = []

    def choice(alphabet: str) -> str:
        if not chars:
            chars.extend(next(codes))
        return chars.pop(0)

    return PageHub(PageHubConfig(**config), clock=clock, choice=choice), clock


def test_a_code_pairs_once_and_bad_codes_are_refused_by_name():
    hub, clock = _hub(code_ttl_s=60)
    code, ttl_s = hub.new_code()
    assert (code, ttl_s) == ("ABCDEF", 60)
    with pytest.raises(PairingError, match="pairing code 'ZZZZZZ' is not one this ComfyUI gave out"):
        hub.pair("zzzzzz", {})
    token = hub.pair(" abcdef ", {"browser": "Chrome"})  # typed in lower case with spaces: the same code
    assert len(token) == 32 and hub.pages()[0] | {"info": None} == {
        "code": "ABCDEF",
        "connected": True,
        "silent_s": 0.0,
        "busy": False,
        "info": None,
    }
    with pytest.raises(PairingError, match="'ABCDEF' is not one .* or it was used already"):
        hub.pair("ABCDEF", {})
    late, _ = hub.new_code()
    clock.now += 61
    with pytest.raises(PairingError, match=rf"pairing code '{late}' expired 1 s ago \(a code lasts 60 s\)"):
        hub.pair(late, {})
    with pytest.raises(PairingError, match="not paired with ComfyUI"):
        hub.take_job("not-a-token")


def test_resolve_names_the_page_or_says_how_to_pair():
    hub, clock = _hub(stale_after_s=10)
    with pytest.raises(PairingError, match="no phone page is connected to this ComfyUI: open .*/sakura/phone"):
        hub.resolve("page")
    first = hub.pair(hub.new_code()[0], {})
    assert hub.resolve("page") == "ABCDEF" and hub.resolve("page:abcdef") == "ABCDEF"
    hub.pair(hub.new_code()[0], {})
    with pytest.raises(
        PairingError,
        match=r"2 phone pages are connected \(ABCDEF, GHJKMN\): set the connection to "
        r"page:CODE, e.g. page:ABCDEF",
    ):
        hub.resolve("page")
    with pytest.raises(PairingError, match="no phone page paired with code 'QQQQQQ'; paired: ABCDEF, GHJKMN"):
        hub.resolve("page:QQQQQQ")
    with pytest.raises(PairingError, match="'http://x' is not a phone page"):
        hub.resolve("http://x")
    clock.now += 11
    hub.take_job(first)  # only the first page is still polling
    assert hub.resolve("page") == "ABCDEF"
    with pytest.raises(PairingError, match="phone page GHJKMN has not polled for 11 s"):
        hub.resolve("page:GHJKMN")


def test_a_job_goes_to_its_page_with_progress_and_result():
    hub, clock = _hub()
    token = hub.pair(hub.new_code()[0], {})
    job = hub.submit("ABCDEF", {"prompt": "p"}, timeout_s=60)
    with pytest.raises(PageChannelError, match="phone page ABCDEF is running another job"):
        hub.submit("ABCDEF", {}, timeout_s=60)
    assert hub.wait(job, 0) is None and job.state == "queued"
    taken = hub.take_job(token)
    assert taken == {"job_id": job.job_id, "prompt": "p"} and hub.take_job(token) is None  # taken once
    assert hub.beat(token, job.job_id, {"phase": "computed", "done": 2, "total": 4}) is False
    assert hub.wait(job, 0) is None and job.progress["done"] == 2
    hub.finish(token, job.job_id, {"width": 1})
    assert hub.wait(job, 0) == {"width": 1}
    assert hub.pages()[0]["busy"] is False  # free for the next job
    with pytest.raises(PairingError, match="is not page ABCDEF's current job"):
        hub.beat(token, job.job_id)


def test_a_silent_page_fails_its_job_within_stale_after_s():
    hub, clock = _hub(stale_after_s=10)
    token = hub.pair(hub.new_code()[0], {})
    job = hub.submit("ABCDEF", {}, timeout_s=600)
    hub.take_job(token)
    clock.now += 9
    hub.beat(token, job.job_id)
    clock.now += 10
    assert hub.wait(job, 0) is None  # 10 s since the last beat: still within the bound
    clock.now += 0.5
    with pytest.raises(PageChannelError, match=r"phone page ABCDEF stopped answering 10 s ago \(the page was closed"):
        hub.wait(job, 0)
    assert hub.pages()[0]["busy"] is False


def test_a_page_that_closes_fails_its_job_at_once_and_is_unpaired():
    hub, _ = _hub()
    token = hub.pair(hub.new_code()[0], {})
    job = hub.submit("ABCDEF", {}, timeout_s=600)
    hub.take_job(token)
    hub.close(token)
    with pytest.raises(PageChannelError, match="phone page ABCDEF: the page was closed or left during the job"):
        hub.wait(job, 0)
    assert hub.pages() == []
    with pytest.raises(PairingError):
        hub.take_job(token)


def test_timeout_error_and_cancel():
    hub, clock = _hub(stale_after_s=10)
    token = hub.pair(hub.new_code()[0], {})
    job = hub.submit("ABCDEF", {}, timeout_s=30)
    hub.take_job(token)
    for _ in range(4):  # beating, but never done
        clock.now += 8
        hub.beat(token, job.job_id)
    with pytest.raises(PageChannelError, match="phone page ABCDEF did not finish the job in time"):
        hub.wait(job, 0)
    job = hub.submit("ABCDEF", {}, timeout_s=30)
    hub.take_job(token)
    hub.fail(token, job.job_id, "no execution provider could run the model")
    with pytest.raises(PageChannelError, match="the phone page ABCDEF failed: no execution provider"):
        hub.wait(job, 0)
    job = hub.submit("ABCDEF", {}, timeout_s=30)
    hub.take_job(token)
    hub.cancel(job)  # ComfyUI's interrupt: the page hears it, and a late result is refused
    with pytest.raises(PairingError):
        hub.beat(token, job.job_id)
    assert hub.pages()[0]["busy"] is False


def test_concurrent_pages_each_get_only_their_job():
    hub, _ = _hub()
    tokens = {}
    for _ in range(3):
        code, _ = hub.new_code()
        tokens[code] = hub.pair(code, {})
    jobs = {code: hub.submit(code, {"for": code}, timeout_s=60) for code in tokens}
    results: dict[str, object] = {}

    def page(code: str) -> None:
        taken = hub.take_job(tokens[code])
        hub.finish(tokens[code], taken["job_id"], {"for": taken["for"]})

    threads = [threading.Thread(target=page, args=(code,)) for code in tokens]
    for t in threads:
        t.start()
    for code, job in jobs.items():
        while (result := hub.wait(job, 0.05)) is None:
            pass
        results[code] = result
    for t in threads:
        t.join(5)
    assert results == {code: {"for": code} for code in tokens}


def test_pairing_is_bounded():
    hub, clock = _hub(max_pages=2, max_codes=2)
    codes = [hub.new_code()[0] for _ in range(3)]
    with pytest.raises(PairingError):
        hub.pair(codes[0], {})  # the oldest code went when the third was given out
    first = hub.pair(codes[1], {})
    clock.now += 1
    hub.pair(codes[2], {})
    clock.now += 1
    hub.take_job(first)  # the first page is the one heard from last
    hub.pair(hub.new_code()[0], {})
    assert sorted(p["code"] for p in hub.pages()) == [codes[1], "VWXYZ2"]  # codes[2]: silent longest
    with pytest.raises(ValueError, match=r"PageHubConfig.stale_after_s must be > 0 seconds, got 0"):
        PageHubConfig(stale_after_s=0)
