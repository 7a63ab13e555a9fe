"""Sakura Template KV Loader: pick a published template from a SAKURA server's catalog (or a local store folder)
and check its manifest against the model (``sakura_core.edit.fetch_template_manifest``); outputs the
``SAKURA_TEMPLATE`` handle and shows the template's KV mode and schedule (a per-step template serves only the step
count it was precomputed for)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from comfy_api.latest import io

from ._common import CATEGORY, READ_TOKEN_ENV, SakuraModel, SakuraNodeError, SakuraTemplate, resolve_token, run_async
from ._stream import TemplateHandle

__all__ = ["SERVER", "STORE", "SakuraTemplateLoader"]

SERVER = "server"
STORE = "local store"


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
        token = resolve_token(token, READ_TOKEN_ENV)
        if source == SERVER:
            where = {"server_url": server_url.strip().rstrip("/"), "store_dir": None}
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
            raise SakuraNodeError(
                f"template {template_id!r}: {e}. The server requires a read token: set $SAKURA_READ_TOKEN in "
                "ComfyUI's environment (or type it into this node's token field, which saves it in the workflow)"
            ) from e
        except (FetchError, ValueError) as e:
            raise SakuraNodeError(f"template {template_id!r}: {e}") from e
        handle = dataclasses.replace(handle, manifest=manifest)
        return io.NodeOutput(handle, ui={"text": [handle.describe()]})
