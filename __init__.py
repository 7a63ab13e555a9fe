"""SAKURA as a ComfyUI custom-node folder.

ComfyUI imports this module from ``custom_nodes/``. It registers the Sakura V3 nodes through
``comfy_entrypoint`` only when ComfyUI's API imports; anywhere else (tests, pip installs, plain Python)
it imports nothing heavy and registers nothing.

A ComfyUI-Manager or Comfy Registry install is a copy of this folder plus ``pip install -r requirements.txt`` (the
third-party packages; never torch, which stays ComfyUI's): the pack's own packages (``sakura_core``,
``cloud_server``, ``android_bridge``) are then not installed, so this module makes them importable from this folder
when no installed copy is found. A failed import raises an ``ImportError`` that names the missing piece and the fix
(ComfyUI then lists the pack as IMPORT FAILED with that message).
"""

import importlib.util as _ilu
import logging as _logging
import os as _os
import sys as _sys

__all__ = []
WEB_DIRECTORY = None  # the frontend extension (web/sakura.js), handed to ComfyUI with the nodes

_HERE = _os.path.dirname(_os.path.abspath(__file__))
_OWN_PACKAGES = ("sakura_core", "cloud_server", "android_bridge")


def _own_packages_importable() -> None:
    """Append this folder to ``sys.path`` when ``sakura_core`` is not installed (a Manager / Registry install);
    warn when an installed copy from another folder would run instead of this one."""
    spec = _ilu.find_spec("sakura_core")
    if spec is None:
        _sys.path.append(_HERE)
        return
    origin = _os.path.dirname(_os.path.dirname(_os.path.abspath(spec.origin or "")))
    if _os.path.realpath(origin) != _os.path.realpath(_HERE):
        _logging.getLogger(__name__).warning(
            "SAKURA: sakura_core is imported from %s, not from this node pack (%s); run `%s -m pip uninstall "
            "sakura-kv` (or `pip install -e %s`) so the nodes and the core are the same version",
            origin,
            _HERE,
            _sys.executable,
            _HERE,
        )


def _missing_requirements() -> list[str]:
    """The distributions of ``requirements.txt`` that the Python running ComfyUI lacks (checked before any import:
    some are imported only when ComfyUI asks for the node list)."""
    import importlib.metadata as md
    import re

    missing = []
    with open(_os.path.join(_HERE, "requirements.txt"), encoding="utf-8") as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                name = re.split(r"[<>=!~;\[ ]", line, maxsplit=1)[0]
                try:
                    md.version(name)
                except md.PackageNotFoundError:
                    missing.append(name)
    return missing


def _install_hint(what: str) -> ImportError:
    requirements = _os.path.join(_HERE, "requirements.txt")
    return ImportError(
        f"SAKURA nodes not registered: the Python running ComfyUI ({_sys.executable}) lacks {what}; install the "
        f"pack's requirements into it: {_sys.executable} -m pip install -r {requirements}"
    )


def _import_error(e: ImportError) -> ImportError:
    """The reason the nodes cannot load, with the fix: a ComfyUI without the V3 API, or a package not installed."""
    missing = (e.name or "").split(".")[0]
    if missing == "comfy_api":
        why = (
            f"this ComfyUI has no V3 node API ({e}); the SAKURA nodes need comfy_api.latest: update ComfyUI "
            "(0.29.0 or later: the version the pack is tested with)"
        )
    elif missing and missing not in _OWN_PACKAGES:
        return _install_hint(f"the package {missing!r} ({e})")
    else:
        why = f"{e}; the pack folder {_HERE} looks incomplete: clone or download it again"
    return ImportError(f"SAKURA nodes not registered: {why}")


if _ilu.find_spec("comfy_api") is not None:  # pragma: no cover - exercised inside ComfyUI
    _own_packages_importable()
    _missing = _missing_requirements()
    if _missing:
        raise _install_hint(", ".join(_missing))
    try:
        from .nodes import comfy_entrypoint  # noqa: F401
    except ImportError as e:
        raise _import_error(e) from e
    WEB_DIRECTORY = "./web"
    __all__ = ["WEB_DIRECTORY", "comfy_entrypoint"]
