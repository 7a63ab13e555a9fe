"""The sampler's dispatch to a phone page paired with ComfyUI (the Sakura Phone Device's ``page`` / ``page:CODE``):
the job (image, prompt, template id, cloud URL, seed, steps, policy) goes to the page through the pairing hub
(``nodes/page_routes.py``), the page fetches the template KV from the cloud itself, runs the edit and posts the image
and its report back. The node waits with ComfyUI's progress bar; a page that goes silent, fails or runs past
:data:`PAGE_JOB_TIMEOUT_S` is a node error; an interrupt cancels the job on the page."""

from __future__ import annotations

import base64

import numpy as np

from android_bridge.page_channel import PageChannelError, PairingError
from android_bridge.page_report import page_edit_report
from sakura_core.edit_settings import EditSettings

from ._common import POLL_S, SakuraNodeError
from ._stream import EditRun, KVStream
from .page_routes import check_result_image, page_hub

__all__ = ["PAGE_JOB_TIMEOUT_S", "is_page_connection", "page_info", "run_on_page"]

#: Seconds a page may take for one job (fetch, decode, every step) before the node gives up.
PAGE_JOB_TIMEOUT_S = 600.0


def is_page_connection(connection: str) -> bool:
    return connection.strip() == "page" or connection.strip().startswith("page:")


def page_info(connection: str) -> dict:
    """The connected page ``connection`` names (its code and what it said of itself); a node error saying how to
    pair one when there is none."""
    hub = page_hub()
    try:
        code = hub.resolve(connection)
    except PairingError as e:
        raise SakuraNodeError(f"{e} (the connection field)") from e
    return {"kind": "page", "code": code, **hub.info(code)}


def _job_payload(device, stream: KVStream, user_image: np.ndarray, settings: EditSettings, cloud_url: str) -> dict:
    template, server = stream.template, stream.template.server
    height, width = user_image.shape[:2]
    rgba = np.concatenate([user_image, np.full((height, width, 1), 255, np.uint8)], axis=2)  # (H, W, 4)
    return {
        "cloud_url": cloud_url,
        "cloud_token": server.token if server is not None else None,
        "template_id": template.template_id,
        "model_id": template.model_id,
        "prompt": settings.prompt,
        "steps": settings.steps,
        "seed": settings.seed,
        "policy": settings.policy,
        "image": {"width": width, "height": height, "rgba_b64": base64.b64encode(rgba.tobytes()).decode()},
    }


def run_on_page(
    device,
    stream: KVStream,
    user_image: np.ndarray,
    settings: EditSettings,
    *,
    run: EditRun,
    on_tick,
    cloud_url: str,
) -> tuple[np.ndarray, dict]:
    """Run the edit (``settings``: the sampler's, validated) on the page ``device.connection`` names; progress lands
    in ``run``; an interrupt cancels it."""
    import comfy.model_management

    hub = page_hub()
    info = page_info(device.connection)
    code = info["code"]
    payload = _job_payload(device, stream, user_image, settings, cloud_url)
    try:
        job = hub.submit(code, payload, PAGE_JOB_TIMEOUT_S)
    except (PageChannelError, PairingError) as e:
        raise SakuraNodeError(str(e)) from e
    try:
        while (result := hub.wait(job, POLL_S)) is None:
            if job.progress.get("phase") == "computed":  # steps done of steps: whole steps of the bar
                run.layers_started = int(job.progress.get("done", 0)) * run.layers
            on_tick()
            comfy.model_management.throw_exception_if_processing_interrupted()
    except PageChannelError as e:
        raise SakuraNodeError(f"{e} (connection {device.connection!r})") from e
    except BaseException:
        hub.cancel(job)  # an interrupt: the page hears it at its next beat
        raise
    try:
        rgba = check_result_image(result)
    except ValueError as e:
        raise SakuraNodeError(f"the phone page {code} sent back a bad image: {e}") from e
    image = np.frombuffer(rgba, np.uint8).reshape(result["height"], result["width"], 4)[..., :3].copy()
    template = {
        "template_id": stream.template.template_id,
        "model_id": stream.template.model_id,
        "server_url": stream.template.server.url if stream.template.server is not None else None,
    }
    report = page_edit_report(
        result["report"],
        image,
        template=template,
        link=settings.link.to_wire(),
        policy_requested=settings.policy,
        connection=f"page:{code}",
        cloud_url=cloud_url,
    )
    return image, report
