"""The live bench's published template store, kept between runs (``sakura bench e2e --mode live``).

Precomputing the bench model's template (every codec level, each level's PSNR from held-out probe edits) takes most of
a live run, and the same inputs always give the same store: the model's seeded random weights, the template image, the
KV mode and steps, and the code that codes and publishes it. :func:`template_store` keeps the published store under a
key digesting all of those (the weights' and the image's bytes, the source files of the codec, precompute, model and
store packages, torch's version), so a policy or runtime change reruns the bench without it, while a change to anything
the store depends on makes a new key (precomputed afresh). A store is built in a temporary folder beside the cache and
renamed into place once complete; a folder without its completion marker is never used. Each run serves a hard-linked
copy, so nothing the server does touches the cache; the :data:`KEEP` stores used last are kept, older ones removed when
a new one is made.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from sakura_core.files import cache_root

__all__ = ["COMPLETE", "KEEP", "default_live_cache_dir", "store_key", "template_store"]

#: the file a complete cached store holds (its key and what it was built from, as JSON)
COMPLETE = "COMPLETE.json"
#: complete stores kept (the ones used last; ~50 MB each for the per-step bench model)
KEEP = 3

_PACKAGE_ROOT = Path(__file__).resolve().parents[2]
#: the sources a published template depends on: the codecs and their formats, precompute, the model, the store
_SOURCES = (
    "sakura_core/kv",
    "sakura_core/precompute",
    "sakura_core/models",
    "sakura_core/metrics.py",
    "cloud_server/precompute.py",
    "cloud_server/store.py",
    "cloud_server/write_path.py",
)


def default_live_cache_dir() -> Path:
    """``$SAKURA_CACHE_DIR`` or ``~/.cache/sakura``, then ``live-bench``."""
    return cache_root() / "live-bench"


def _sources_digest(root: Path = _PACKAGE_ROOT) -> str:
    h = hashlib.sha256()
    for rel in _SOURCES:
        p = root / rel
        files = sorted(p.rglob("*.py")) if p.is_dir() else [p]
        for f in files:
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def _weights_digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def store_key(
    weights: torch.nn.Module, spec: dict, template: np.ndarray, kv_mode: str, steps: int, codecs: tuple[str, ...]
) -> tuple[str, dict]:
    """The cache key (hex) of a published store and the inputs it digests (recorded beside the store); ``weights``:
    the transformer whose KV the store holds."""
    inputs = {
        "spec": spec,
        "weights_sha256": _weights_digest(weights),
        "template_sha256": hashlib.sha256(np.ascontiguousarray(template).tobytes()).hexdigest(),
        "template_shape": list(template.shape),
        "kv_mode": kv_mode,
        "steps": int(steps),
        "codecs": list(codecs),
        "sources_sha256": _sources_digest(),
        "torch": torch.__version__,
    }
    key = hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()[:24]
    return key, inputs


def template_store(
    key: str,
    inputs: dict,
    build: Callable[[str], None],
    cache_dir: Path | None,
    work: str,
    log: Callable[[str], None] = print,
    keep: int = KEEP,
) -> str:
    """A published store for ``key``, ready to serve, under ``work`` (a folder the caller removes): a hard-linked
    copy of the cached one, else ``build(folder)`` publishes it (into the cache first when ``cache_dir`` is set,
    renamed into place only once it returned; then only the ``keep`` stores used last are kept). Returns the
    folder to serve."""
    out = os.path.join(work, "store")
    if cache_dir is None:
        build(out)
        return out
    cache_dir = Path(cache_dir)
    entry = cache_dir / key
    if (entry / COMPLETE).is_file():
        os.utime(entry / COMPLETE)  # used now: kept over stores used less recently
        log(f"template store: cached ({entry}; key {key}; --no-live-cache precomputes afresh)")
    else:
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f".{key}-", dir=cache_dir)
        try:
            build(os.path.join(tmp, "store"))
            Path(tmp, "store", COMPLETE).write_text(json.dumps({"key": key, "inputs": inputs}, indent=1, default=str))
            if entry.exists() and not (entry / COMPLETE).is_file():  # a folder that is no store: a leftover
                shutil.rmtree(entry)
            try:
                os.replace(os.path.join(tmp, "store"), entry)
            except OSError:
                if not (entry / COMPLETE).is_file():
                    raise
                # another run with the same key cached its store meanwhile: that one is served, this one dropped
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        log(f"template store: precomputed and cached ({entry}; key {key})")
        _prune(cache_dir, keep, log)
    shutil.copytree(entry, out, copy_function=_link_or_copy, ignore=shutil.ignore_patterns(COMPLETE))
    return out


def _prune(cache_dir: Path, keep: int, log: Callable[[str], None]) -> None:
    """Remove all but the ``keep`` stores used last, folders that are no complete store, and temporary folders of
    builds that stopped over a day ago (a killed run's; a running build's is younger)."""
    used, gone = [], 0
    for p in cache_dir.iterdir():
        if p.name.startswith("."):
            if p.is_dir() and time.time() - p.stat().st_mtime > 86400:
                shutil.rmtree(p, ignore_errors=True)
            continue
        if p.is_dir() and (p / COMPLETE).is_file():
            used.append(((p / COMPLETE).stat().st_mtime, p))
        elif p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
            gone += 1
    for _, p in sorted(used, reverse=True)[keep:]:
        shutil.rmtree(p, ignore_errors=True)
        gone += 1
    if gone:
        log(f"template store cache: removed {gone} store(s) used less recently (keeping {keep})")


def _link_or_copy(src: str, dst: str) -> None:
    """Hard link (no bytes copied; the server's atomic writes replace a link, never the cached file), else copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
