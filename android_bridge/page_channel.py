"""The channel between ComfyUI and the phone pages paired with it (dispatch to a page, ``nodes/page_routes.py``).

ComfyUI gives out a short pairing code (:meth:`PageHub.new_code`); the page on the phone sends it back
(:meth:`PageHub.pair`) and gets a page token; then it asks for jobs (:meth:`PageHub.take_job`, which the route holds
open a bounded time: a long poll), posts progress (:meth:`PageHub.beat`) and the result or its error. The node's side
submits a job to one page (:meth:`PageHub.submit`) and waits for it (:meth:`PageHub.wait`): a page that stops
answering (closed, asleep, off the network) fails the job after ``stale_after_s``, a job that takes longer than its
timeout fails, and a cancel (ComfyUI's interrupt) tells the page to stop at its next beat. Thread-safe: the routes
run on ComfyUI's event loop, the node in its worker thread. Clock and randomness are injected.

A page is named by the code it paired with (``page:CODE`` in the Phone Device node's connection field).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["CODE_ALPHABET", "PageChannelError", "PageHub", "PageHubConfig", "PageJob", "PairingError"]

#: Pairing codes: no 0/O, 1/I/L, easy to type on a phone.
CODE_ALPHABET = "23456789ABCDEFGHJKMNPQRSTUVWXYZ"


class PageChannelError(RuntimeError):
    """A job on a page failed: the page is gone, its job timed out, or it reported an error (the message says)."""


class PairingError(ValueError):
    """A pairing code or page token that this ComfyUI does not know (or no longer: expired, closed)."""


@dataclass(frozen=True)
class PageHubConfig:
    """Bounds of the channel.

    Attributes:
        code_ttl_s: seconds a pairing code can be used (once) after ComfyUI showed it (default 300).
        code_length: characters of a code, from :data:`CODE_ALPHABET` (default 6).
        stale_after_s: seconds without a poll or a beat after which a page counts as gone (default 10).
        hold_s: seconds a job poll is held open at most (default 20; the page polls again).
        max_pages: pages paired at once (default 8); pairing another drops the one silent longest.
        max_codes: codes given out and not yet used (default 16); the oldest goes first.
    """

    code_ttl_s: float = 300.0
    code_length: int = 6
    stale_after_s: float = 10.0
    hold_s: float = 20.0
    max_pages: int = 8
    max_codes: int = 16

    def __post_init__(self) -> None:
        for name in ("code_ttl_s", "stale_after_s", "hold_s"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"PageHubConfig.{name} must be > 0 seconds, got {value!r}")
        for name in ("code_length", "max_pages", "max_codes"):
            value = getattr(self, name)
            if not (isinstance(value, int) and 1 <= value <= 64):
                raise ValueError(f"PageHubConfig.{name} must be an integer in 1..64, got {value!r}")


@dataclass
class PageJob:
    """One job on one page: ``payload`` goes to the page; ``state`` is queued -> running -> done / failed."""

    job_id: str
    code: str
    payload: dict = field(repr=False)
    deadline: float
    state: str = "queued"
    progress: dict = field(default_factory=dict)
    result: dict | None = field(default=None, repr=False)
    error: str | None = None
    cancelled: bool = False


@dataclass
class _Page:
    code: str
    token: str = field(repr=False)
    info: dict
    last_seen: float
    closed: str | None = None
    job: PageJob | None = None


class PageHub:
    """Pairing codes, paired pages and their jobs (one job per page at a time)."""

    def __init__(
        self,
        config: PageHubConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        token_hex: Callable[[int], str] = secrets.token_hex,
        choice: Callable[[str], str] = secrets.choice,
    ) -> None:
        self.config = config or PageHubConfig()
        self._clock, self._token_hex, self._choice = clock, token_hex, choice
        self._lock = threading.Condition()
        self._codes: dict[str, float] = {}  # code -> expiry (clock seconds)
        self._pages: dict[str, _Page] = {}  # code -> page
        self.reset()

    def reset(self) -> None:
        """Forget every code, page and job (a job waited for fails)."""
        with self._lock:
            for page in self._pages.values():
                self._fail(page, "ComfyUI's pairing list was reset")
            self._codes.clear()
            self._pages.clear()
            self._lock.notify_all()

    # ---- pairing ---------------------------------------------------------------------------------------------
    def new_code(self) -> tuple[str, float]:
        """A fresh pairing code and its lifetime in seconds."""
        with self._lock:
            now = self._clock()
            self._codes = {c: t for c, t in self._codes.items() if t > now}
            while len(self._codes) >= self.config.max_codes:
                self._codes.pop(next(iter(self._codes)))
            code = "".join(self._choice(CODE_ALPHABET) for _ in range(self.config.code_length))
            while code in self._codes or code in self._pages:
                code = "".join(self._choice(CODE_ALPHABET) for _ in range(self.config.code_length))
            self._codes[code] = now + self.config.code_ttl_s
            return code, self.config.code_ttl_s

    def pair(self, code: str, info: dict) -> str:
        """The page token for ``code`` (usable once); :class:`PairingError` naming the code when it is not valid."""
        code = str(code).strip().upper()
        with self._lock:
            now = self._clock()
            expiry = self._codes.pop(code, None)
            if expiry is None:
                raise PairingError(
                    f"pairing code {code!r} is not one this ComfyUI gave out, or it was used already: "
                    "press 'pair a phone page' on the Sakura Phone Device node for a new code"
                )
            if expiry <= now:
                raise PairingError(
                    f"pairing code {code!r} expired {now - expiry:.0f} s ago (a code lasts "
                    f"{self.config.code_ttl_s:.0f} s): press 'pair a phone page' for a new one"
                )
            while len(self._pages) >= self.config.max_pages:
                oldest = min(self._pages.values(), key=lambda p: p.last_seen)
                self._fail(
                    oldest, f"page {oldest.code} was unpaired: {self.config.max_pages} pages are paired at most"
                )
                del self._pages[oldest.code]
            token = self._token_hex(16)
            self._pages[code] = _Page(code=code, token=token, info=dict(info), last_seen=now)
            return token

    def pages(self) -> list[dict]:
        """The paired pages: ``{"code", "connected", "silent_s", "busy", "info"}``."""
        with self._lock:
            now = self._clock()
            return [
                {
                    "code": p.code,
                    "connected": self._alive(p, now),
                    "silent_s": round(now - p.last_seen, 1),
                    "busy": p.job is not None,
                    "info": p.info,
                }
                for p in self._pages.values()
            ]

    def resolve(self, target: str) -> str:
        """The code of the page ``target`` names: ``page`` (the one connected page) or ``page:CODE``."""
        kind, _, code = target.strip().partition(":")
        with self._lock:
            now = self._clock()
            live = sorted(c for c, p in self._pages.items() if self._alive(p, now))
            if kind != "page":
                raise PairingError(f"connection {target!r} is not a phone page: write 'page' or 'page:CODE'")
            if code:
                code = code.strip().upper()
                if code not in self._pages:
                    raise PairingError(f"no phone page paired with code {code!r}; paired: {', '.join(live) or 'none'}")
                if code not in live:
                    raise PairingError(
                        f"phone page {code} has not polled for {now - self._pages[code].last_seen:.0f}"
                        " s (closed or off the network): open the page on the phone again"
                    )
                return code
            if not live:
                raise PairingError(
                    "no phone page is connected to this ComfyUI: open http://THIS-HOST:PORT/sakura/"
                    "phone on the phone and enter the code 'pair a phone page' shows"
                )
            if len(live) > 1:
                raise PairingError(
                    f"{len(live)} phone pages are connected ({', '.join(live)}): set the connection "
                    f"to page:CODE, e.g. page:{live[0]}"
                )
            return live[0]

    def info(self, code: str) -> dict:
        with self._lock:
            return dict(self._pages[code].info)

    # ---- the page's side -------------------------------------------------------------------------------------
    def _page(self, token: str) -> _Page:
        for page in self._pages.values():
            if secrets.compare_digest(page.token, str(token)):
                return page
        raise PairingError("this page is not paired with ComfyUI (unknown or expired page token): pair it again")

    def take_job(self, token: str) -> dict | None:
        """The page's next job (``{"job_id", ...payload}``), or None: none queued. Counts as a sign of life."""
        with self._lock:
            page = self._page(token)
            page.last_seen = self._clock()
            job = page.job
            if job is None or job.state != "queued":
                return None
            job.state = "running"
            self._lock.notify_all()
            return {"job_id": job.job_id, **job.payload}

    def beat(self, token: str, job_id: str, progress: dict | None = None) -> bool:
        """A sign of life during a job, with its progress; True when the job is cancelled (the page stops)."""
        with self._lock:
            page = self._page(token)
            page.last_seen = self._clock()
            job = self._job(page, job_id)
            if progress:
                job.progress = dict(progress)
            self._lock.notify_all()
            return job.cancelled or job.state != "running"

    def finish(self, token: str, job_id: str, result: dict) -> None:
        with self._lock:
            page = self._page(token)
            page.last_seen = self._clock()
            job = self._job(page, job_id)
            job.state, job.result = "done", result
            self._lock.notify_all()

    def fail(self, token: str, job_id: str, message: str) -> None:
        with self._lock:
            page = self._page(token)
            page.last_seen = self._clock()
            job = self._job(page, job_id)
            job.state, job.error = "failed", f"the phone page {page.code} failed: {str(message)[:2000]}"
            self._lock.notify_all()

    def close(self, token: str, why: str = "the page was closed or left") -> None:
        """The page says it goes (``pagehide``): its job fails at once and it is unpaired."""
        with self._lock:
            page = self._page(token)
            self._fail(page, f"phone page {page.code}: {why} during the job")
            page.closed = why
            del self._pages[page.code]
            self._lock.notify_all()

    def _job(self, page: _Page, job_id: str) -> PageJob:
        if page.job is None or page.job.job_id != job_id:
            raise PairingError(f"job {job_id!r} is not page {page.code}'s current job (cancelled or timed out)")
        return page.job

    # ---- the node's side -------------------------------------------------------------------------------------
    def submit(self, code: str, payload: dict, timeout_s: float) -> PageJob:
        """Queue ``payload`` for page ``code`` (one job at a time per page)."""
        with self._lock:
            page = self._pages.get(code)
            if page is None:
                raise PairingError(f"no phone page paired with code {code!r}")
            if page.job is not None:
                raise PageChannelError(f"phone page {code} is running another job ({page.job.job_id}); wait for it")
            job = PageJob(job_id=self._token_hex(8), code=code, payload=payload, deadline=self._clock() + timeout_s)
            page.job = job
            self._lock.notify_all()
            return job

    def wait(self, job: PageJob, wait_s: float) -> dict | None:
        """The job's result when done (the page is free again); None while it runs (``job.progress`` moves);
        :class:`PageChannelError` when it failed, timed out, or the page went silent for ``stale_after_s``."""
        with self._lock:
            self._lock.wait_for(lambda: job.state in ("done", "failed"), timeout=wait_s)
            now = self._clock()
            page = self._pages.get(job.code)
            if job.state == "running" or job.state == "queued":
                if page is None or page.job is not job:
                    job.state, job.error = "failed", f"phone page {job.code} was unpaired during the job"
                elif not self._alive(page, now):
                    job.state = "failed"
                    job.error = (
                        f"phone page {job.code} stopped answering {now - page.last_seen:.0f} s ago (the page "
                        "was closed, the phone slept or left the network); open it again and rerun"
                    )
                elif now >= job.deadline:
                    job.state, job.error = "failed", f"phone page {job.code} did not finish the job in time"
            if job.state in ("done", "failed") and page is not None and page.job is job:
                page.job = None
            if job.state == "failed":
                raise PageChannelError(job.error)
            return job.result if job.state == "done" else None

    def cancel(self, job: PageJob) -> None:
        """Stop ``job`` (an interrupt): the page hears it at its next beat; the page is free at once."""
        with self._lock:
            job.cancelled = True
            page = self._pages.get(job.code)
            if page is not None and page.job is job:
                page.job = None
            if job.state not in ("done", "failed"):
                job.state, job.error = "failed", "cancelled"
            self._lock.notify_all()

    def _alive(self, page: _Page, now: float) -> bool:
        return page.closed is None and now - page.last_seen <= self.config.stale_after_s

    def _fail(self, page: _Page, why: str) -> None:
        if page.job is not None and page.job.state not in ("done", "failed"):
            page.job.state, page.job.error = "failed", why
        page.job = None
