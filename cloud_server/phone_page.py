"""The phone page's static files at ``/phone`` (``phone_web/`` of a checkout): the page, its ES modules and the npm
modules it imports (``fzstd`` and ``onnxruntime-web``'s WASM build, from ``phone_web/node_modules`` after
``npm ci``; the WASM and the large modules gzip-compressed once and revalidated by ETag:
:mod:`cloud_server.compressed_files`), and the model files of ``sakura export --target web`` at ``/phone/model/``
(``--phone-model DIR``). Open (the page is code, no
data: its API requests carry the read token like any client's). Every response is same-origin isolated
(``Cross-Origin-Opener-Policy: same-origin``, ``Cross-Origin-Embedder-Policy: require-corp``,
``Cross-Origin-Resource-Policy: same-origin``), which multi-threaded WASM needs. The same page served by ComfyUI
(dispatch) fetches from here across origins: ``cloud_server/cors.py`` answers the origins ``--allow-origin`` names.
The file list is ``android_bridge.page_files``'s. A server installed without the checkout's ``phone_web/`` answers 404 naming what is
missing."""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from android_bridge.page_files import ISOLATION_HEADERS, PHONE_WEB, PageFileError, page_file

from .http_util import _access, _json_error
from .state import STATE_KEY

__all__ = ["PHONE_WEB", "phone_routes"]

_TYPES = {".html": "text/html", ".js": "text/javascript", ".mjs": "text/javascript", ".css": "text/css"}
_MODEL_TYPES = {".json": "application/json", ".onnx": "application/octet-stream", ".f32": "application/octet-stream"}
#: vendor files above this size are sent gzip-compressed with an ETag (the WASM binaries, the large ES modules)
COMPRESS_MIN_BYTES = 64 * 1024


def _file(root: Path, relative: str, types: dict) -> Path:
    """``root / relative`` when it is a served kind of file inside ``root``, else 404."""
    path = (root / relative).resolve()
    if root.resolve() not in path.parents or path.suffix not in types or not path.is_file():
        raise _json_error(404, f"no phone page file {relative!r}")
    return path


def _send(path: Path) -> web.Response:
    if path.suffix == ".wasm":
        return _send_binary(path, "application/wasm")
    return web.Response(
        body=path.read_bytes(), content_type=_TYPES[path.suffix], charset="utf-8", headers=ISOLATION_HEADERS
    )


def _send_binary(path: Path, kind: str) -> web.Response:
    return web.Response(body=path.read_bytes(), content_type=kind, headers=ISOLATION_HEADERS)


def _model_file(request: web.Request, name: str) -> web.Response:
    """``/phone/model/NAME``: a file of the exported web model (``--phone-model``), else a 404 saying how."""
    root = request.app[STATE_KEY].config.phone_model_dir
    if root is None or not (Path(root) / "model.json").is_file():
        raise _json_error(
            404,
            "no phone model is served: run `sakura export --target web --out DIR` and start "
            "`sakura serve --phone-model DIR`",
        )
    path = _file(Path(root), name, _MODEL_TYPES)
    return _send_binary(path, _MODEL_TYPES[path.suffix])


async def _send_compressed(request: web.Request, path: Path) -> web.Response:
    """A large vendor file: gzip when the client accepts it (compressed once per server, kept in memory), with a
    strong ETag so a page loaded again revalidates (304, no body) instead of fetching ~15 MB."""
    sent = await request.app[STATE_KEY].phone_files.get(path)
    headers = {**ISOLATION_HEADERS, "ETag": sent.etag, "Vary": "Accept-Encoding"}
    if sent.etag in [t.strip() for t in request.headers.get("If-None-Match", "").split(",")]:
        return web.Response(status=304, headers=headers)
    kind = "application/wasm" if path.suffix == ".wasm" else "text/javascript"
    if "gzip" in request.headers.get("Accept-Encoding", "").lower():
        # the body is gzip bytes as they are: aiohttp must not compress again (no enable_compression)
        return web.Response(body=sent.gzip, content_type=kind, headers={**headers, "Content-Encoding": "gzip"})
    return web.Response(body=sent.raw, content_type=kind, headers=headers)


@_access("open")
async def handle_phone(request: web.Request) -> web.Response:
    """``/phone`` and ``/phone/``: the page; ``/phone/src/...``: its modules; ``/phone/vendor/...``: npm's files
    (``android_bridge.page_files`` says which); ``/phone/model/...``: the web model."""
    rest = request.match_info.get("rest", "")
    if rest.startswith("model/"):
        return _model_file(request, rest.removeprefix("model/"))
    try:
        path = page_file(rest)
    except PageFileError as e:
        raise _json_error(e.status, str(e)) from None
    if rest.startswith("vendor/") and (path.suffix == ".wasm" or path.stat().st_size > COMPRESS_MIN_BYTES):
        return await _send_compressed(request, path)
    return _send(path)


def phone_routes(routes: web.RouteTableDef) -> None:
    """Add the page's routes to the server's table."""
    routes.get("/phone")(handle_phone)
    routes.get("/phone/{rest:.*}")(handle_phone)
