"""Sakura Template KV Loader: pick a published template from a SAKURA server's catalog (or a local store folder)
and check its manifest against the model (``sakura_core.template_open.fetch_template_manifest``); outputs the
``SAKURA_TEMPLATE`` handle and shows the template's KV mode and schedule (a per-step template serves only the step
count it was precomputed for)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from comfy_api.latest import io

from sakura_core.kv.manifest import Reference

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
    manifest = handle.loaded_manifest
    if manifest.schedule is not None:
        steps = manifest.schedule.steps
        mode = f"KV mode: per-step (one KV per step and layer): {handle.schedule}; the sampler must run {steps} steps"
    else:
        mode = "KV mode: single (one KV per layer): serves any step count"
    refs = manifest.references
    total = sum(r.tokens for r in refs)
    together = ", attending to each other" if len(refs) > 1 else ""
    return [
        f"template: {handle.template_id}",
        mode,
        f"references: {len(refs)} ({total} tokens{together}), {manifest.num_layers} layers",
        *(f"  {_reference_label(i, r)}" for i, r in enumerate(refs)),
        f"from: {handle.source.label}",
    ]


def _reference_label(i: int, ref: Reference) -> str:
    """``1. person: 64 px, 4x4 = 16 tokens`` (what the manifest says of one reference)."""
    size = f"{ref.size[0]} px, " if ref.size else ""
    rows, cols = ref.token_grid
    return f"{i + 1}. {ref.name or f'reference {i + 1}'}: {size}{rows}x{cols} = {ref.tokens} tokens"


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
                SakuraModel.Input(
                    "model",
                    optional=True,
                    tooltip="The model the template's KV must have been computed for. Leave it empty for ComfyUI's "
                    "own klein MODEL: Sakura Template KV checks the template against that.",
                ),
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
        cls,
        model=None,
        template_id: str = "",
        source: str = SERVER,
        server_url: str = "",
        token: str = "",
        store_dir: str = "",
    ) -> io.NodeOutput:
        from sakura_core.fetch.client import AuthError, FetchError
        from sakura_core.fetch.sources import ServerSource, StoreSource, TemplateSource
        from sakura_core.template_open import fetch_template_manifest

        template_id = template_id.strip()
        read_token, token_source = resolve_token_source(token, READ_TOKEN_ENV)
        where: TemplateSource
        if source == SERVER:
            where = ServerSource(check_server_url("server_url", server_url), read_token)
        elif source == STORE:
            if not store_dir.strip():
                raise SakuraNodeError("source is 'local store' but store_dir is empty: give the store folder")
            where = StoreSource(str(Path(store_dir.strip()).expanduser().resolve()))
        else:
            raise SakuraNodeError(f"source must be {SERVER!r} or {STORE!r}, got {source!r}")
        handle = TemplateHandle(template_id=template_id, model_id=model.model_id if model else "", source=where)
        try:
            manifest = run_async(
                lambda: fetch_template_manifest(where, template_id, model),
                name="sakura-template-loader",
            )
        except AuthError as e:
            what = f"the SAKURA server at {where.label}"
            raise SakuraNodeError(
                f"template {template_id!r}: {refused_token_message(what, token_source, READ_TOKEN_ENV, 'token')}"
            ) from e
        except (FetchError, ValueError) as e:
            raise SakuraNodeError(f"template {template_id!r}: {e}") from e
        handle = dataclasses.replace(handle, manifest=manifest, model_id=handle.model_id or manifest.model_id)
        info = template_info(handle)
        if model is None:
            info.append("not checked against a model here: Sakura Template KV checks it against ComfyUI's MODEL")
        return io.NodeOutput(handle, ui={"text": info})
