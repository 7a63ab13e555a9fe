"""Admitting a job to the phone agent: its queue place first, then its cloud host, then the template's manifest.

A job takes its place in the queue (:func:`reserve`, 429 ``queue_full`` when every place is taken or held by another
job being admitted) before any network work, so jobs beyond the queue never reach the cloud. Then the job's cloud
host is checked (``android_bridge.cloud_host``: 400 ``bad_job`` naming the host and the setting) and only then is the
manifest fetched, from the checked addresses, without following redirects. Each refusal is logged once, naming the
side at fault: the job (a host this agent does not fetch from) or the cloud (a redirect, an error, a bad manifest).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from aiohttp import web

from .agent_state import AgentState
from .cloud_host import CloudHostRefused, check_cloud_host, system_resolve

__all__ = ["admit", "admit_template", "http_error", "reserve"]

logger = logging.getLogger(__name__)


def http_error(status: int, message: str, code: str, headers: dict | None = None, **extra) -> web.HTTPException:
    """The agent's JSON error ``{"error", "code", "status", ...}`` as the aiohttp exception of ``status``."""
    cls = {
        400: web.HTTPBadRequest,
        401: web.HTTPUnauthorized,
        404: web.HTTPNotFound,
        409: web.HTTPConflict,
        410: web.HTTPGone,
        415: web.HTTPUnsupportedMediaType,
        422: web.HTTPUnprocessableEntity,
        429: web.HTTPTooManyRequests,
        502: web.HTTPBadGateway,
        503: web.HTTPServiceUnavailable,
    }[status]
    body = json.dumps({"error": message, "code": code, "status": status, **extra})
    return cls(text=body, content_type="application/json", headers=headers)


def admit(state: AgentState) -> None:
    """One job runs, ``queue_size`` more may wait (places held by jobs being admitted count); beyond: 429."""
    size = state.config.queue_size
    if state.unfinished() + state.admitting >= size + 1:
        raise http_error(
            429,
            f"the phone is busy: {len(state.queued())} job(s) waiting, {state.admitting} being "
            f"admitted (queue size {size})",
            "queue_full",
            {"Retry-After": "5"},
        )


@contextmanager
def reserve(state: AgentState) -> Iterator[None]:
    """Hold a queue place while the job is admitted (429 when there is none); the caller queues the job before
    leaving the block, with no ``await`` between, so the place passes to it."""
    admit(state)
    state.admitting += 1
    try:
        yield
    finally:
        state.admitting -= 1


async def _checked_addresses(state: AgentState, req) -> tuple[str, ...]:
    cfg = state.config
    try:
        return await asyncio.wait_for(
            check_cloud_host(
                req.source.url, allow_private=cfg.private_cloud_allowed, resolve=state.resolve or system_resolve
            ),
            cfg.manifest_timeout_s,
        )
    except CloudHostRefused as e:
        logger.info("job refused, the job's cloud_url is at fault: %s", e)
        raise http_error(400, f"bad job: {e}", "bad_job") from e
    except (OSError, asyncio.TimeoutError) as e:
        logger.info("job refused: cannot resolve the cloud host of %s (%s)", req.source.url, type(e).__name__)
        raise http_error(
            502, f"cannot resolve the cloud host of {req.source.url} ({type(e).__name__})", "cloud_unreachable"
        ) from e


async def admit_template(state: AgentState, req, declared_model_id: str | None):
    """``(request, manifest)``: the request pinned to the cloud host's checked addresses, and the template's
    manifest checked against the model this phone holds (``sakura_core.edit.check_template``, the one check: the
    job's edit gets this manifest and does not check it again); refuse a template made for a model this phone does
    not hold (409), or that does not exist (404). Only the template id and the cloud token go to the cloud."""
    held = state.model_id
    if declared_model_id is not None and declared_model_id != held:
        raise http_error(
            409,
            f"this phone does not hold model {str(declared_model_id)[:16]}…; it holds "
            f"{held[:16]}… ({state.model.spec.name})",
            "model_not_held",
            held_model_id=held,
        )
    req = replace(req, source=replace(req.source, addresses=await _checked_addresses(state, req)))
    try:
        return req, await _fetch_manifest(state, req)
    except web.HTTPException as e:
        if e.status >= 500:
            logger.warning(
                "job on template %r refused, the cloud at %s is at fault: %s",
                req.template_id,
                req.source.url,
                json.loads(e.text or "{}").get("error"),
            )
        raise


async def _fetch_manifest(state: AgentState, req):
    from sakura_core.edit import check_template as check_against_model
    from sakura_core.fetch.client import (
        AuthError,
        FetchError,
        ManifestError,
        ModelMismatchError,
        RedirectRefusedError,
        TemplateNotFoundError,
    )
    from sakura_core.kv.manifest import ManifestLimitError

    held, tid, url = state.model_id, req.template_id, req.source.url
    try:
        async with req.source.open() as client:
            manifest = await asyncio.wait_for(client.get_manifest(tid), state.config.manifest_timeout_s)
        return check_against_model(manifest, tid, state.model)
    except ModelMismatchError as e:
        raise http_error(
            409,
            f"template {tid!r} was computed for another model than the one this phone holds "
            f"({held[:16]}…, {state.model.spec.name}): {str(e)[:160]}",
            "model_not_held",
            held_model_id=held,
        ) from e
    except TemplateNotFoundError as e:
        raise http_error(404, f"the cloud has no template {tid!r}", "template_not_found") from e
    except AuthError as e:
        raise http_error(
            502, f"the cloud at {url} refused this phone's token (set the job's cloud_token)", "cloud_auth"
        ) from e
    except ManifestLimitError as e:  # our own message: the field, its value (a number) and the bound
        raise http_error(422, f"template {tid!r} is too large for this phone: {e}", "template_too_large") from e
    except ManifestError as e:  # the class only: the text may quote what the cloud sent
        raise http_error(
            502,
            f"the cloud at {url} sent a manifest of template {tid!r} this phone cannot use ({type(e).__name__})",
            "bad_manifest",
        ) from e
    except RedirectRefusedError as e:  # the URL asked and the Location answered; the redirect was not followed
        raise http_error(
            502,
            f"the cloud at {url} answered HTTP {e.status} for the manifest of template {tid!r}, "
            f"a redirect to {e.location[:200]!r}; the agent does not follow redirects: give the "
            "final server URL as cloud_url",
            "cloud_redirect",
            location=e.location[:300],
        ) from e
    except (FetchError, asyncio.TimeoutError, OSError) as e:
        # the error's class only: its text may quote whatever page the URL led to
        raise http_error(502, f"cannot reach the cloud at {url} ({type(e).__name__})", "cloud_unreachable") from e
