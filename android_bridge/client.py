"""Host-side client of the phone agent: what the ComfyUI Phone Device node and ``sakura phone run`` call.

    client = PhoneClient.connect("http://127.0.0.1:8765", token="...")   # or "adb", "adb:SERIAL@8765"
    client.info()                                                          # device profile, model id, budget
    image, report = client.run_job(user_image, cloud_url=..., template_id=..., prompt=...,
                                   on_progress=lambda ev: bar.update_absolute(ev["done"], ev["total"]))
    client.cancel()                                                        # from another thread: stop the job
    client.close()                                                         # removes an adb forward

The user image travels to the phone only, in the agent's job body (android_bridge.wire); the phone fetches the
template KV from the cloud itself. Every method has an ``async`` twin (``ainfo``, ``arun_job``); the synchronous
ones run their own event loop (in a helper thread when the calling thread already runs one).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import logging
import os
import threading
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass
from typing import Any

import aiohttp
import numpy as np

from sakura_core.fetch.errors import connection_problem

from .transports import Transport, transport_from_spec
from .wire import CONTENT_TYPE, encode_job_body

__all__ = [
    "TOKEN_ENV",
    "PhoneClient",
    "PhoneError",
    "PhoneJob",
    "PhoneJobCancelled",
    "PhoneJobFailed",
]

logger = logging.getLogger(__name__)

TOKEN_ENV = "SAKURA_PHONE_TOKEN"
_POLL_S = 0.2  # how often a waiting run_job looks at cancel()


class PhoneError(RuntimeError):
    """The agent refused or failed a request: ``status`` (HTTP, or 0), ``code`` (the agent's error code)."""

    def __init__(self, message: str, status: int = 0, code: str = "", body: dict | None = None):
        super().__init__(message)
        self.status, self.code, self.body = status, code, body or {}


class PhoneJobFailed(PhoneError):
    """The job ran and failed on the phone (``code`` says why, e.g. ``fetch_failed``, ``model_not_held``)."""


class PhoneJobCancelled(PhoneError):
    """The job was cancelled (``cancel()``, a raising progress callback, a timeout on the phone)."""


@dataclass(frozen=True)
class PhoneJob:
    """What to edit with, besides the image (all of it goes to the phone; the phone asks the cloud for the template).

    Attributes:
        cloud_url: SAKURA cloud server (or CDN) base URL, as the *phone* reaches it.
        template_id: template to edit against.
        prompt: edit prompt (stays on the phone).
        steps: denoising steps.
        seed: noise seed (same seed, same image).
        policy: fetch policy (``sakura_core.policy.policies.POLICIES``).
        bandwidth: link emulation on the phone, a ``sakura_core.fetch.link.LinkSpec`` or its string form: None/"live"
            or "fixed:<Mbit/s>" (a trace file is on the host, not on the phone); sent as the string form.
        cloud_token: read token of the cloud server, if it has one.
        model_id: the model the template must be for (the phone refuses others); None = not checked up front.
    """

    cloud_url: str
    template_id: str
    prompt: str
    steps: int = 8
    seed: int = 0
    policy: str = "sakura"
    bandwidth: str | None = None
    cloud_token: str | None = None
    model_id: str | None = None

    def __post_init__(self) -> None:
        from sakura_core.fetch.link import LinkSpec
        from sakura_core.limits import check_prompt

        check_prompt(self.prompt)  # refused here, before anything goes to the phone
        spec = self.bandwidth
        if isinstance(spec, LinkSpec) and spec.kind == "trace" or isinstance(spec, str) and spec.startswith("trace:"):
            raise ValueError(
                f"link {str(spec)!r} reads a file on this host; a phone job takes 'live' or 'fixed:<Mbit/s>'"
            )
        link = LinkSpec.parse(spec)  # raises naming the bad value
        object.__setattr__(self, "bandwidth", link.to_wire())

    def header(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


def _run_sync(make_coro: Callable[[], Coroutine]) -> Any:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make_coro())
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sakura-phone") as pool:
        return pool.submit(lambda: asyncio.run(make_coro())).result()


def _fit_image(image: np.ndarray, size: int) -> np.ndarray:
    """(H, W, 3|4) uint8 or float in [0, 1] -> (size, size, 3) uint8 (centre crop, bicubic), unchanged if it fits."""
    from sakura_core.models.edit_model import load_image

    arr = np.asarray(image)
    if arr.ndim != 3 or arr.shape[2] not in (3, 4):
        raise ValueError(f"image must be (H, W, 3) or (H, W, 4), got shape {arr.shape}")
    if arr.dtype != np.uint8:
        arr = np.clip(np.round(arr.astype(np.float64) * 255.0), 0, 255).astype(np.uint8)
    arr = arr[..., :3]
    if arr.shape[:2] == (size, size):
        return np.ascontiguousarray(arr)
    logger.info("image %dx%d fitted to the phone model's %dx%d", arr.shape[1], arr.shape[0], size, size)
    return load_image(arr, size)


async def _raise_for(resp: aiohttp.ClientResponse, what: str) -> None:
    if resp.status < 300:
        return
    if resp.status < 400:  # requests carry the pairing token and the user's image: never re-sent elsewhere
        where = resp.headers.get("Location", "(no Location)")
        raise PhoneError(
            f"{what}: the phone agent at {resp.url} answered HTTP {resp.status} redirecting to {where}; "
            "redirects are not followed: point the host at the agent's own URL",
            resp.status,
            "redirect",
        )
    try:
        body = await resp.json(content_type=None)
    except (ValueError, aiohttp.ContentTypeError):
        body = {"error": (await resp.text())[:300]}
    if not isinstance(body, dict):
        body = {"error": str(body)[:300]}
    message = body.get("error") or resp.reason
    raise PhoneError(f"{what}: HTTP {resp.status}: {message}", resp.status, body.get("code", ""), body)


class PhoneClient:
    """A paired phone agent behind a transport. Create with :meth:`connect` (or the constructor and ``open``)."""

    def __init__(self, transport: Transport, token: str, *, timeout_s: float = 30.0, job_timeout_s: float = 900.0):
        if not token:
            raise PhoneError(f"a pairing token is required (argument or ${TOKEN_ENV})")
        self.transport = transport
        self._token = token
        self.timeout_s = timeout_s
        self.job_timeout_s = job_timeout_s
        self.base_url: str | None = None
        self._cancel = threading.Event()
        self._lock = threading.Lock()

    # ---- lifecycle ------------------------------------------------------------------------------------------
    @classmethod
    def connect(
        cls,
        spec: str | Transport,
        token: str | None = None,
        *,
        adb_client: Any | None = None,
        timeout_s: float = 30.0,
        check: bool = True,
    ) -> PhoneClient:
        """Open the transport (``http://...``, ``adb[:SERIAL][@PORT]`` or a Transport) and, with ``check``, call
        :meth:`info` once so a wrong token or an unreachable phone fails here, with the reason."""
        transport = transport_from_spec(spec, adb_client=adb_client) if isinstance(spec, str) else spec
        client = cls(transport, token or os.environ.get(TOKEN_ENV, ""), timeout_s=timeout_s)
        client.open()
        if check:
            try:
                client.info()
            except BaseException:
                client.close()
                raise
        return client

    def open(self) -> str:
        if self.base_url is None:
            self.base_url = self.transport.open()
        return self.base_url

    def close(self) -> None:
        self.transport.close()
        self.base_url = None

    def __enter__(self) -> PhoneClient:
        self.open()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def describe(self) -> dict:
        return self.transport.describe()

    @property
    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._token}"}

    def _session(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            base_url=self.open(),
            headers=self._headers,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.timeout_s, sock_read=None),
        )

    # ---- API ------------------------------------------------------------------------------------------------
    def info(self) -> dict:
        """``GET /v1/info``: device profile, model (id, name, image size), memory budget, queue."""
        return _run_sync(self.ainfo)

    async def ainfo(self) -> dict:
        async with self._session() as session:
            return await self._info(session)

    def run_job(
        self,
        image: np.ndarray,
        job: PhoneJob | None = None,
        *,
        on_progress: Callable[[dict], None] | None = None,
        **job_fields,
    ) -> tuple[np.ndarray, dict]:
        """Run one edit on the phone; returns (edited image (S, S, 3) uint8, the phone's report).

        Args:
            image: the private user image, (H, W, 3) uint8 or float in [0, 1]; fitted to the phone model's size.
            job: a :class:`PhoneJob`, or its fields as keywords (``cloud_url=, template_id=, prompt=, ...``).
            on_progress: called with each progress event (``step``, ``layer``, ``done``, ``total``); if it
                raises, the job is cancelled on the phone and the exception propagates (ComfyUI's interrupt).

        Raises:
            PhoneError: refused (401 token, 409 model not held, 422 over the memory budget, 429 busy, ...).
            PhoneJobFailed: the phone ran the job and it failed.
            PhoneJobCancelled: cancelled by :meth:`cancel` or on the phone.
        """
        return _run_sync(lambda: self.arun_job(image, job, on_progress=on_progress, **job_fields))

    def cancel(self) -> None:
        """Cancel the job :meth:`run_job` is running (thread-safe; the phone stops between layers)."""
        self._cancel.set()

    async def arun_job(
        self,
        image: np.ndarray,
        job: PhoneJob | None = None,
        *,
        on_progress: Callable[[dict], None] | None = None,
        **job_fields,
    ) -> tuple[np.ndarray, dict]:
        if job is not None and job_fields:
            raise TypeError(f"pass a PhoneJob or its fields, not both (got job and {sorted(job_fields)})")
        job = job if job is not None else PhoneJob(**job_fields)
        with self._lock:
            self._cancel.clear()
        async with self._session() as session:
            info = await self._info(session)
            size = int(info["model"]["image_size"])
            user = _fit_image(image, size)
            body = encode_job_body(job.header(), {"image": user})
            async with session.post(
                "/v1/jobs",
                data=body,
                headers={"Content-Type": CONTENT_TYPE},
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=self.timeout_s * 2),
            ) as resp:
                await _raise_for(resp, f"job on template {job.template_id!r}")
                submitted = await resp.json()
            job_id = submitted["job_id"]
            try:
                terminal = await self._follow(session, job_id, on_progress)
            except BaseException:
                await self._delete(session, job_id, "the host stopped waiting")
                raise
            if terminal["type"] == "cancelled":
                await self._delete(session, job_id, None)
                raise PhoneJobCancelled(f"job {job_id} cancelled: {terminal.get('reason')}", 0, "cancelled", terminal)
            if terminal["type"] == "error":
                await self._delete(session, job_id, None)
                raise PhoneJobFailed(
                    f"job {job_id} failed on the phone: {terminal.get('error')}", 0, terminal.get("code", ""), terminal
                )
            result = await self._result(session, job_id)
            await self._delete(session, job_id, None)  # the phone forgets the job and its result
            return result

    # ---- internals ------------------------------------------------------------------------------------------
    async def _info(self, session: aiohttp.ClientSession) -> dict:
        try:
            async with session.get(
                "/v1/info", allow_redirects=False, timeout=aiohttp.ClientTimeout(total=self.timeout_s)
            ) as resp:
                await _raise_for(resp, "phone info")
                return await resp.json()
        except aiohttp.ClientError as e:
            problem = connection_problem(e)
            if problem is not None:
                raise PhoneError(
                    f"cannot reach the phone agent at {self.base_url} ({problem}) — is `sakura phone-agent` running "
                    f"there{' (and adb forwarding)' if self.transport.kind == 'adb' else ''}?"
                ) from e
            raise PhoneError(f"cannot reach the phone agent at {self.base_url} ({self.transport.kind}): {e}") from e

    async def _follow(self, session, job_id: str, on_progress) -> dict:
        """Read the job's events until done/error/cancelled; honour :meth:`cancel` while waiting."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.job_timeout_s
        cancel_sent = False
        async with session.ws_connect(f"/v1/jobs/{job_id}", heartbeat=20.0) as ws:
            while True:
                if self._cancel.is_set() and not cancel_sent:
                    await ws.send_json({"type": "cancel"})
                    cancel_sent = True
                if loop.time() > deadline:
                    raise PhoneError(f"job {job_id}: no result within {self.job_timeout_s:.0f} s", 0, "timeout")
                try:
                    msg = await ws.receive(timeout=_POLL_S)
                except asyncio.TimeoutError:
                    continue
                if msg.type in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.ERROR):
                    raise PhoneError(f"job {job_id}: the progress socket closed before the job ended", 0, "lost")
                if msg.type != aiohttp.WSMsgType.TEXT:
                    continue
                event = json.loads(msg.data)
                kind = event.get("type")
                if kind == "progress" and on_progress is not None:
                    on_progress(event)
                elif kind in ("done", "error", "cancelled"):
                    return event

    async def _result(self, session, job_id: str) -> tuple[np.ndarray, dict]:
        from sakura_core.images import decode_image

        async with session.get(
            f"/v1/jobs/{job_id}/result", allow_redirects=False, timeout=aiohttp.ClientTimeout(total=self.timeout_s)
        ) as resp:
            await _raise_for(resp, f"result of job {job_id}")
            reader = aiohttp.MultipartReader.from_response(resp)
            report, png = None, None
            while (part := await reader.next()) is not None:
                if not isinstance(part, aiohttp.BodyPartReader):
                    raise PhoneError(
                        f"result of job {job_id}: a nested multipart part (the agent sends two plain parts)"
                    )
                ctype = part.headers.get("Content-Type", "")
                if ctype.startswith("application/json"):
                    report = await part.json()
                elif ctype == "image/png":
                    png = bytes(await part.read(decode=False))
        if report is None or png is None:
            raise PhoneError(
                f"result of job {job_id}: expected a JSON report and a PNG, got "
                f"{'no report' if report is None else 'no image'}"
            )
        try:
            image = decode_image(png, f"result image of job {job_id}")[0]
        except ValueError as e:  # not an image, past the pixel limit
            raise PhoneError(str(e)) from e
        digest = hashlib.sha256(np.ascontiguousarray(image).tobytes()).hexdigest()
        if report.get("image_sha256") not in (None, digest):
            raise PhoneError(
                f"result of job {job_id}: image digest {digest[:16]}… does not match the report's "
                f"{str(report.get('image_sha256'))[:16]}…"
            )
        return image, report

    async def _delete(self, session, job_id: str, why: str | None) -> None:
        try:
            async with session.delete(
                f"/v1/jobs/{job_id}", allow_redirects=False, timeout=aiohttp.ClientTimeout(total=self.timeout_s)
            ) as r:
                if why is not None:
                    logger.info("job %s: %s; asked the phone to cancel it (HTTP %d)", job_id, why, r.status)
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            logger.warning("job %s: could not reach the phone to cancel/forget it: %s", job_id, e)
