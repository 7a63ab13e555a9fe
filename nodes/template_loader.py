"""Sakura Template KV Loader: pick a published template from a SAKURA server's catalog (or a local store folder)
and check its manifest against the model (``sakura_core.edit.fetch_template_manifest``); outputs the
``SAKURA_TEMPLATE`` handle and shows the template's KV mode and schedule (a per-step template serves only the step
count it was precomputed for)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from comfy_api.latest import io

from ._common import (
    CATEGORY,
    READ_TOKEN_ENV,
    SakuraModel,
    SakuraNodeError,
    SakuraTemplate,
    refused_token_message,
    resolve_token_source,
    run_async,
)
from ._stream import TemplateHandle

__all__ = ["SERVER", "STORE", "SakuraTemplateLoader", "check_server_url", "template_info"]

SERVER = "server"
STORE = "local store"


def check_server_url(field: str, url: str) -> str:
    """``url`` without a trailing slash; a SakuraNodeError naming ``field`` when it is not an http(s) URL."""
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise SakuraNodeError(f"{field} {url!r} must start with http:// or https://, e.g. http://127.0.0.1:8080")
    return url


def template_info(handle: TemplateHandle) -> list[str]:
    """What the node shows once it ran: the template, its KV mode, the steps it serves, its references, where from."""
    manifest = handle.manifest
    rows, cols = manifest.token_grid
    if manifest.schedule is not None:
        steps = manifest.schedule.steps
        mode = f"KV mode: per-step (one KV per step and layer): {handle.schedule}; the sampler must run {steps} steps"
    else:
        mode = "KV mode: single (one KV per layer): serves any step count"
    refs = manifest.raw.get("references") or [{"tokens": rows * cols}]
    tokens = ", ".join(str(r.get("tokens", "?")) for r in refs)
    return [
        f"template: {handle.template_id}",
        mode,
        f"references: {len(refs)} ({tokens} tokens; grid {rows}x{cols}), {manifest.num_layers} layers",
        f"from: {handle.source}",
    ]


class SakuraTemplateLoader(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="SakuraTemplateLoader",
            display_name="Sakura Template KV Loader",
            category=CATEGORY,
            description="Picks a published template (its precomputed, compressed attention KV) from a SAKURA "
            "server's catalog or a local store folder, and checks that it was computed for the model.",
            inputs=[
                SakuraModel.Input("model", tooltip="The model the template's KV must have been computed for."),
                io.String.Input(
                    "template_id",
                    default="face-swap-astronaut",
                    tooltip="Id in the catalog. Type one, or use the 'choose a published template' button to pick from "
                    "what the server at server_url publishes.",
                ),
                io.Combo.Input(
                    "source",
                    options=[SERVER, STORE],
                    default=SERVER,
                    tooltip="'server' = a SAKURA server or CDN at server_url (what a phone can use too); 'local store' "
                    "= a store folder on this machine (store_dir), e.g. one `sakura examples` or `sakura precompute` "
                    "wrote.",
                ),
                io.String.Input(
                    "server_url", default="http://127.0.0.1:8080", tooltip="SAKURA server or CDN (source = server)."
                ),
                io.String.Input(
                    "token",
                    default="",
                    tooltip="Read token of the server, if it requires one. Leave empty to read $SAKURA_READ_TOKEN "
                    "(or SAKURA_READ_TOKEN in ComfyUI's user/sakura_tokens.json): a token typed here is saved in the "
                    "workflow and in every saved image's metadata.",
                ),
                io.String.Input("store_dir", default="", tooltip="Local store folder (source = local store)."),
            ],
            outputs=[
                SakuraTemplate.Output(
                    "template",
                    display_name="SAKURA_TEMPLATE",
                    tooltip="The template's checked manifest (where its KV shards are, its KV mode and schedule); into "
                    "the adaptive fetch.",
                )
            ],
        )

    @classmethod
    def execute(
        cls, model, template_id: str, source: str, server_url: str, token: str, store_dir: str
    ) -> io.NodeOutput:
        from sakura_core.edit import fetch_template_manifest
        from sakura_core.fetch.client import AuthError, FetchError

        template_id = template_id.strip()
        token, token_source = resolve_token_source(token, READ_TOKEN_ENV)
        if source == SERVER:
            where = {"server_url": check_server_url("server_url", server_url), "store_dir": None}
        elif source == STORE:
            if not store_dir.strip():
                raise SakuraNodeError("source is 'local store' but store_dir is empty: give the store folder")
            where = {"server_url": None, "store_dir": str(Path(store_dir.strip()).expanduser().resolve())}
        else:
            raise SakuraNodeError(f"source must be {SERVER!r} or {STORE!r}, got {source!r}")
        handle = TemplateHandle(template_id=template_id, model_id=model.model_id, token=token, **where)
        try:
            manifest = run_async(
                lambda: fetch_template_manifest(handle.template_source(), template_id, model),
                name="sakura-template-loader",
            )
        except AuthError as e:
            what = f"the SAKURA server at {handle.source}"
            raise SakuraNodeError(
                f"template {template_id!r}: {refused_token_message(what, token_source, READ_TOKEN_ENV, 'token')}"
            ) from e
        except (FetchError, ValueError) as e:
            raise SakuraNodeError(f"template {template_id!r}: {e}") from e
        handle = dataclasses.replace(handle, manifest=manifest)
        return io.NodeOutput(handle, ui={"text": template_info(handle)})
