"""The phone page's static files, one list for both servers that serve it: ``sakura serve`` at ``/phone``
(``cloud_server/phone_page.py``) and ComfyUI at ``/sakura/phone`` (``nodes/page_routes.py``, the page paired with
ComfyUI for dispatch). The page itself (``phone_web/page/index.html``), its ES modules (``phone_web/src/``) and the
npm modules it imports from ``phone_web/node_modules`` after ``npm ci`` (``fzstd``, ``onnxruntime-web``'s WASM build).

The page's addresses are relative to its ``<base href="/phone/">``; :func:`page_html` rewrites that one tag for
another mount point (and marks a dispatch page), so both servers send the same page code."""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "ISOLATION_HEADERS",
    "ORT_FILES",
    "PAGE_TYPES",
    "PHONE_WEB",
    "NPM_MISSING",
    "PageFileError",
    "page_file",
    "page_html",
]

#: The checkout's page folder (absent from an installed wheel: the page is served from a checkout).
PHONE_WEB = Path(__file__).resolve().parents[1] / "phone_web"
#: Every response of the page is same-origin isolated (which multi-threaded WASM needs).
ISOLATION_HEADERS = {
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Embedder-Policy": "require-corp",
    "Cross-Origin-Resource-Policy": "same-origin",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}
PAGE_TYPES = {
    ".html": "text/html",
    ".js": "text/javascript",
    ".mjs": "text/javascript",
    ".css": "text/css",
    ".wasm": "application/wasm",
}
#: onnxruntime-web's files the page loads: the WASM build (its ES module, its loader and the binary), and the JSEP
#: build that adds WebGPU (tried first where the browser offers it).
ORT_FILES = {
    "ort.wasm.min.mjs",
    "ort-wasm-simd-threaded.mjs",
    "ort-wasm-simd-threaded.wasm",
    "ort.webgpu.min.mjs",
    "ort-wasm-simd-threaded.jsep.mjs",
    "ort-wasm-simd-threaded.jsep.wasm",
}
NPM_MISSING = "the phone page's npm packages are missing: run `npm ci` in phone_web/ (node 20+)"
_BASE_TAG = '<base href="/phone/">'


class PageFileError(LookupError):
    """No such page file (``status`` 404); the message says what is missing and how to get it."""

    status = 404


def _inside(root: Path, relative: str) -> Path:
    path = (root / relative).resolve()
    if root.resolve() not in path.parents or path.suffix not in PAGE_TYPES or not path.is_file():
        raise PageFileError(f"no phone page file {relative!r}")
    return path


def page_file(rest: str) -> Path:
    """The file behind ``rest`` (the address below the page's mount point, e.g. ``src/edit.js``,
    ``vendor/ort/ort.wasm.min.mjs``); :class:`PageFileError` when there is none or npm has not run."""
    if not (PHONE_WEB / "page" / "index.html").is_file():
        raise PageFileError("the phone page is not here: serve from a checkout that has phone_web/")
    if rest in ("", "index.html"):
        return PHONE_WEB / "page" / "index.html"
    if rest == "vendor/fzstd.mjs":
        path = PHONE_WEB / "node_modules" / "fzstd" / "esm" / "index.mjs"
    elif rest.startswith("vendor/ort/"):
        if rest.removeprefix("vendor/ort/") not in ORT_FILES:
            raise PageFileError(f"no phone page file {rest!r}")
        path = PHONE_WEB / "node_modules" / "onnxruntime-web" / "dist" / rest.removeprefix("vendor/ort/")
    elif rest.startswith("src/"):
        return _inside(PHONE_WEB / "src", rest.removeprefix("src/"))
    else:
        raise PageFileError(f"no phone page file {rest!r}")
    if not path.is_file():
        raise PageFileError(NPM_MISSING)
    return path


def page_html(mount: str, *, dispatch: bool) -> bytes:
    """The page for ``mount`` (e.g. ``/sakura/phone/``): its base tag names that folder; ``dispatch`` marks the
    page that pairs with ComfyUI and takes its jobs (``data-dispatch="true"``)."""
    text = (PHONE_WEB / "page" / "index.html").read_text(encoding="utf-8")
    if _BASE_TAG not in text:
        raise PageFileError(f"phone_web/page/index.html has no {_BASE_TAG}: the page cannot be mounted elsewhere")
    mark = ' data-dispatch="true"' if dispatch else ""
    return text.replace(_BASE_TAG, f'<base href="{mount}"{mark}>', 1).encode()
