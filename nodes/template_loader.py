"""Sakura Template KV Loader: pick a published template from a SAKURA server's catalog (or a local store folder)
and check its manifest against the model (``sakura_core.edit.fetch_template_manifest``); outputs the
``SAKURA_TEMPLATE`` handle."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from comfy_api.latest import io

from ._common import CATEGORY, SakuraModel, SakuraNodeError, SakuraTemplate, run_async
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
                io.String.Input("template_id", default="face-swap-astronaut", tooltip="Id in the catalog."),
                io.Combo.Input("source", options=[SERVER, STORE], default=SERVER),
                io.String.Input(
                    "server_url", default="http://127.0.0.1:8080", tooltip="SAKURA server or CDN (source = server)."
                ),
                io.String.Input("token", default="", tooltip="Read token of the server, if it requires one."),
                io.String.Input("store_dir", default="", tooltip="Local store folder (source = local store)."),
            ],
            outputs=[SakuraTemplate.Output("template", display_name="SAKURA_TEMPLATE")],
        )

    @classmethod
    def execute(
        cls, model, template_id: str, source: str, server_url: str, token: str, store_dir: str
    ) -> io.NodeOutput:
        from sakura_core.edit import fetch_template_manifest
        from sakura_core.fetch.client import FetchError

        template_id = template_id.strip()
        token = token.strip() or None
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
        except (FetchError, ValueError) as e:
            hint = f" (is `sakura serve` running at {server_url}?)" if "failed after" in str(e) else ""
            raise SakuraNodeError(f"template {template_id!r}: {e}{hint}") from e
        return io.NodeOutput(dataclasses.replace(handle, manifest_json=json.dumps(manifest)))
