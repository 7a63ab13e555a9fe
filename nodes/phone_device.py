"""Sakura Phone Device: a paired phone agent (adb or LAN), or a phone page paired with ComfyUI (``page``,
``page:CODE``: ``nodes/page_dispatch.py``), as ``SAKURA_DEVICE``. Given to the sampler, the edit runs
on the phone (``android_bridge.PhoneClient``): the user image and prompt go to the phone only, and the phone fetches
the template's KV from the cloud itself."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from comfy_api.latest import io

from sakura_core.edit_settings import EditSettings

from ._common import (
    CATEGORY,
    PHONE_TOKEN_ENV,
    SakuraDevice,
    SakuraNodeError,
    refused_token_message,
    resolve_token_source,
    start_async,
    wait_interruptible,
)
from ._stream import EditRun, KVStream
from .page_dispatch import is_page_connection, page_info, run_on_page

__all__ = ["PhoneDevice", "SakuraPhoneDevice", "phone_error_message", "run_on_phone"]


@dataclass(frozen=True)
class PhoneDevice:
    """``SAKURA_DEVICE``: how to reach a phone agent; a connection is opened per run and closed after it.

    Attributes:
        connection: ``http(s)://HOST:PORT`` (LAN or loopback), ``adb`` or ``adb:SERIAL[@PORT]``; ``page`` or
            ``page:CODE`` for a phone page paired with this ComfyUI.
        token: pairing token (never shown in reprs or reports).
        token_source: where the token came from (the field, the environment, sakura_tokens.json), for messages.
        cloud_url: the SAKURA server as the phone reaches it; empty = the template's server URL.
        info_json: the agent's ``/v1/info`` answer when the node ran.
    """

    connection: str
    token: str = field(default="", repr=False)
    cloud_url: str = ""
    info_json: str = field(default="{}", repr=False)
    token_source: str = "the node's token field"

    def info(self) -> dict:
        return json.loads(self.info_json)

    def connect(self):
        from android_bridge import PhoneClient

        return PhoneClient.connect(self.connection, self.token or None, check=False)


def phone_error_message(connection: str, error, token_source: str = "the pairing token") -> str:
    """A ``PhoneError`` as the node shows it; a refused pairing token (401) says which token source was refused
    (``token_source``: the field, the environment or sakura_tokens.json) and what to do."""
    if getattr(error, "status", 0) == 401:
        what = f"the phone agent at {connection}"
        return refused_token_message(what, token_source, PHONE_TOKEN_ENV, "Sakura Phone Device's token")
    return f"phone {connection}: {error}"


def run_on_phone(
    device: PhoneDevice,
    stream: KVStream,
    user_image: np.ndarray,
    settings: EditSettings,
    *,
    run: EditRun,
    on_tick: Callable[[], None],
) -> tuple[np.ndarray, dict]:
    """Run the edit (``settings``: the sampler's, validated) on the phone; progress lands in ``run`` (``on_tick``
    shows it); an interrupt cancels the job."""
    from android_bridge import PhoneError, PhoneJob, TransportError

    template = stream.template
    server = template.server
    cloud_url = device.cloud_url.strip() or (server.url if server is not None else None)
    if cloud_url is None:
        raise SakuraNodeError(
            f"template {template.template_id!r} comes from a local store, which the phone cannot reach; serve the "
            "store with `sakura serve` and load the template from that server"
        )
    link = settings.link
    if link.kind == "trace":
        raise SakuraNodeError(
            f"link {link.label!r} is emulated on this machine only; a phone run takes 'live' or a fixed Mbit/s"
        )
    if is_page_connection(device.connection):
        return run_on_page(device, stream, user_image, settings, run=run, on_tick=on_tick, cloud_url=cloud_url)
    job = PhoneJob(
        cloud_url=cloud_url,
        template_id=template.template_id,
        prompt=settings.prompt,
        steps=settings.steps,
        seed=settings.seed,
        policy=settings.policy,
        bandwidth=link.to_wire(),
        cloud_token=server.token if server is not None else None,
        model_id=template.model_id,
    )

    def on_progress(event: dict) -> None:
        run.layers_started = int(event.get("done", run.layers_started))
        run.steps, run.layers = int(event.get("steps", run.steps)), int(event.get("layers", run.layers))

    try:
        client = device.connect()
    except (PhoneError, TransportError, ValueError, OSError) as e:
        raise SakuraNodeError(f"phone {device.connection}: {e}") from e
    try:

        def stop() -> None:
            run.cancel.set()
            client.cancel()

        future = start_async(lambda: client.arun_job(user_image, job, on_progress=on_progress), name="sakura-phone")
        try:
            image, report = wait_interruptible(future, on_tick=on_tick, on_interrupt=stop)
        except PhoneError as e:
            raise SakuraNodeError(phone_error_message(device.connection, e, device.token_source)) from e
    finally:
        client.close()
    report = dict(report)  # the phone's report has the local report's shape (sakura_core.edit_report)
    report["executed_on"] = {**report.get("executed_on", {}), "connection": device.connection, "cloud_url": cloud_url}
    return image, report


class SakuraPhoneDevice(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="SakuraPhoneDevice",
            display_name="Sakura Phone Device",
            category=CATEGORY,
            description="A paired phone running the SAKURA agent. Connect it to the sampler to run the edit on the "
            "phone: the image and prompt go to the phone only; the phone fetches the template KV from the cloud.",
            inputs=[
                io.String.Input(
                    "connection",
                    default="http://127.0.0.1:8765",
                    tooltip="Agent URL (LAN or loopback), 'adb' (the only device) or 'adb:SERIAL[@PORT]'; or 'page' "
                    "(the one phone page paired with this ComfyUI: open /sakura/phone on the phone, enter the code "
                    "'pair a phone page' shows) or 'page:CODE'.",
                ),
                io.String.Input(
                    "token",
                    default="",
                    tooltip="Pairing token of the phone agent. Leave empty to read $SAKURA_PHONE_TOKEN (or "
                    "SAKURA_PHONE_TOKEN in ComfyUI's user/sakura_tokens.json): a token typed here is saved in the "
                    "workflow and in every saved image's metadata.",
                ),
                io.String.Input(
                    "cloud_url",
                    default="",
                    tooltip="The SAKURA server as the phone reaches it (empty: the template's server URL).",
                ),
            ],
            outputs=[
                SakuraDevice.Output(
                    "device",
                    display_name="SAKURA_DEVICE",
                    tooltip="The phone; into the sampler's device input to run the edit there.",
                )
            ],
        )

    @classmethod
    def execute(cls, connection: str, token: str, cloud_url: str) -> io.NodeOutput:
        from android_bridge import PhoneError, TransportError

        phone_token, source = resolve_token_source(token, PHONE_TOKEN_ENV)
        connection, cloud_url = connection.strip(), cloud_url.strip()
        if cloud_url:
            from .template_loader import check_server_url

            cloud_url = check_server_url("cloud_url", cloud_url)
        device = PhoneDevice(connection=connection, token=phone_token or "", cloud_url=cloud_url, token_source=source)
        if is_page_connection(connection):  # a page paired with this ComfyUI: checked now, reached per run
            return io.NodeOutput(dataclasses.replace(device, info_json=json.dumps(page_info(connection))))
        try:
            client = device.connect()
            try:
                info = client.info()
            finally:
                client.close()
        except PhoneError as e:
            raise SakuraNodeError(phone_error_message(device.connection, e, source)) from e
        except (TransportError, ValueError, OSError) as e:
            raise SakuraNodeError(f"phone {device.connection} (the connection field): {e}") from e
        return io.NodeOutput(dataclasses.replace(device, info_json=json.dumps(info)))
