"""Sakura Template KV Loader: pick a published template from a SAKURA server's catalog (or a local store folder)
and check its manifest against the model; outputs the ``SAKURA_TEMPLATE`` handle."""

from __future__ import annotations

import json
from pathlib import Path

from comfy_api.latest import io

from ._common import CATEGORY, READ_TOKEN_ENV, SakuraModel, SakuraNodeError, SakuraTemplate, resolve_token, run_async
from ._stream import TemplateHandle

__all__ = ["SERVER", "STORE", "SakuraTemplateLoader"]

SERVER = "server"
STORE = "local store"


async def _from_server(url: str, token: str | None, template_id: str, model_id: str) -> dict:
    from sakura_core.fetch.client import ShardClient

    async with ShardClient(url, token) as client:
        catalog = await client.get_catalog()
        entries = {t.get("id"): t for t in catalog["templates"] if isinstance(t, dict)}
        if template_id not in entries:
            raise SakuraNodeError(
                f"template {template_id!r} is not in the catalog of {url}; published there: "
                f"{', '.join(sorted(map(str, entries))) or 'none'}"
            )
        listed = entries[template_id].get("model_id")
        if listed is not None and listed != model_id:
            raise SakuraNodeError(
                f"template {template_id!r} on {url} was computed for model {str(listed)[:16]}, not for the loaded "
                f"model {model_id[:16]}; load that model or precompute the template for this one"
            )
        return await client.get_manifest(template_id, expected_model_id=model_id)


def _from_store(folder: str, template_id: str, model_id: str) -> dict:
    from cloud_server.store import LocalStore, StoreError
    from sakura_core.fetch.client import check_manifest

    root = Path(folder).expanduser()
    if not (root / "templates").is_dir():
        raise SakuraNodeError(
            f"{root} is not a SAKURA store (no templates/ folder); create one with "
            f"`sakura precompute --store {root} --image IMAGE --id ID`"
        )
    store = LocalStore(root)
    ids = store.list_templates()
    if template_id not in ids:
        raise SakuraNodeError(
            f"template {template_id!r} is not published in {root}; published there: {', '.join(ids) or 'none'}"
        )
    try:
        return check_manifest(store.get_manifest(template_id), template_id=template_id, model_id=model_id)
    except StoreError as e:
        raise SakuraNodeError(f"template {template_id!r} in {root}: {e}") from e


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
                    tooltip="The template's checked manifest (where its KV shards are); into the adaptive fetch.",
                )
            ],
        )

    @classmethod
    def execute(
        cls, model, template_id: str, source: str, server_url: str, token: str, store_dir: str
    ) -> io.NodeOutput:
        from sakura_core.fetch.client import AuthError, FetchError

        template_id = template_id.strip()
        token = resolve_token(token, READ_TOKEN_ENV)
        try:
            if source == SERVER:
                url = server_url.strip().rstrip("/")
                manifest = run_async(
                    lambda: _from_server(url, token, template_id, model.model_id), name="sakura-template-loader"
                )
                where = {"server_url": url, "store_dir": None}
            elif source == STORE:
                if not store_dir.strip():
                    raise SakuraNodeError("source is 'local store' but store_dir is empty: give the store folder")
                manifest = _from_store(store_dir.strip(), template_id, model.model_id)
                where = {"server_url": None, "store_dir": str(Path(store_dir.strip()).expanduser().resolve())}
            else:
                raise SakuraNodeError(f"source must be {SERVER!r} or {STORE!r}, got {source!r}")
        except AuthError as e:
            raise SakuraNodeError(
                f"template {template_id!r}: {e}. The server requires a read token: set $SAKURA_READ_TOKEN in "
                "ComfyUI's environment (or type it into this node's token field, which saves it in the workflow)"
            ) from e
        except (FetchError, ValueError) as e:
            raise SakuraNodeError(f"template {template_id!r}: {e}") from e
        if tuple(manifest["token_grid"]) != tuple(model.spec.grid):
            raise SakuraNodeError(
                f"template {template_id!r} has token grid {manifest['token_grid']}, the model edits "
                f"{list(model.spec.grid)}; precompute it at the model's resolution"
            )
        handle = TemplateHandle(
            template_id=template_id,
            model_id=model.model_id,
            token=token,
            manifest_json=json.dumps(manifest),
            **where,
        )
        return io.NodeOutput(handle)
