"""What flows between the Sakura nodes: the template handle, the KV stream and the per-run state of one edit.

``KVStream`` is the ``SAKURA_KV_STREAM`` value. The fetch node creates it and calls :meth:`KVStream.start`, which
opens the template in a background thread (``sakura_core.template_open.open_checked_template``: the template image of
the checked manifest, which the device computes template layers from and falls back to when a shard fails) while the
rest of the graph runs. The sampler joins that prefetch and calls ``sakura_core.edit.run_template_edit``, whose
fetch lane streams the shards the policy picks while the device computes. Nothing here orchestrates the edit.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from dataclasses import dataclass, field

from sakura_core.edit_settings import FetchSettings
from sakura_core.fetch.sources import ServerSource, TemplateSource
from sakura_core.kv.manifest import Manifest

from ._common import start_async

__all__ = ["EditRun", "KVStream", "TemplateHandle"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TemplateHandle:
    """``SAKURA_TEMPLATE``: a published template, where it is served, and its manifest (checked against a model).

    Attributes:
        template_id: the template's id.
        model_id: content id of the model the manifest was checked against.
        source: where the template is served: a ``ServerSource`` (a SAKURA server or CDN, with its read token) or a
            ``StoreSource`` (a local store folder read directly); ``sakura_core.fetch.sources``.
        manifest: the manifest as the loader fetched and checked it against the model (a typed
            ``sakura_core.kv.Manifest``, parsed once); None only for a handle nothing was loaded into.
    """

    template_id: str
    model_id: str
    source: TemplateSource
    manifest: Manifest | None = field(default=None, repr=False)

    @property
    def server(self) -> ServerSource | None:
        """The server the template is served from (its URL and read token); None for a local store."""
        return self.source if isinstance(self.source, ServerSource) else None

    @property
    def loaded_manifest(self) -> Manifest:
        """:attr:`manifest`; ``ValueError`` naming the fix for a handle nothing was loaded into."""
        if self.manifest is None:
            raise ValueError(
                f"template {self.template_id!r}: no manifest was loaded into this handle (a Sakura Template KV Loader "
                "loads it)"
            )
        return self.manifest

    @property
    def kv_mode(self) -> str:
        """``"single"`` (one KV per layer, valid for any step count) or ``"per-step"`` (one per (step, layer))."""
        return self.loaded_manifest.kv_mode

    @property
    def schedule(self) -> str:
        """What the template's KV is valid for: ``"any schedule"`` or ``"4 steps, shift 1"`` (per-step)."""
        return self.loaded_manifest.schedule_label

    def describe(self) -> str:
        """One line for the UI: ``"face-swap-astronaut: per-step KV, 4 steps, shift 1 (from http://...)"``."""
        return f"{self.template_id}: {self.kv_mode} KV, {self.schedule} (from {self.source.label})"


class KVStream:
    """``SAKURA_KV_STREAM``: a template, its fetch settings (``sakura_core.edit_settings.FetchSettings``: the
    sampler's ``EditSettings`` holds them), and the background opening of the template.

    The prefetch result (an immutable ``sakura_core.edit.OpenedTemplate``) is shared by every sampler run that gets
    this stream (ComfyUI reuses a cached output); a prefetch that failed is started again by the next :meth:`join`.
    """

    def __init__(self, template: TemplateHandle, settings: FetchSettings):
        self.template = template
        self.settings = settings
        self._lock = threading.Lock()
        self._future: concurrent.futures.Future | None = None
        self.attempts = 0  # prefetches started

    def __repr__(self) -> str:
        return f"KVStream({self.template.template_id!r}, {self.settings})"

    def start(self) -> concurrent.futures.Future:
        """Start the prefetch unless it is running or done; returns its future."""
        with self._lock:
            failed = self._future is not None and self._future.done() and self._future.exception() is not None
            if self._future is None or failed:
                if failed:
                    logger.info("template %s: the last prefetch failed; fetching again", self.template.template_id)
                self._future = start_async(self._prefetch, name=f"sakura-prefetch-{self.template.template_id}")
                self.attempts += 1
            return self._future

    def join(self) -> concurrent.futures.Future:
        """The prefetch future to wait on (started again if the last attempt failed)."""
        return self.start()

    async def _prefetch(self):
        from sakura_core.template_open import open_checked_template

        t = self.template  # its manifest was checked against the model by the Template KV Loader: only the image
        return await open_checked_template(t.source, t.loaded_manifest)


class EditRun:
    """Per-run state of one sampler execution: the cancel event and the progress counter.

    ``on_layer`` is called by the compute thread before each layer; the node's waiting loop reads
    ``layers_started`` for the progress bar and sets ``cancel`` on an interrupt. Call :meth:`reset` before reuse.
    """

    def __init__(self, steps: int, layers: int):
        self.steps = steps
        self.layers = layers
        self.reset()

    @property
    def total(self) -> int:
        return self.steps * self.layers

    def reset(self) -> None:
        self.cancel = threading.Event()
        self.layers_started = 0

    def on_layer(self, step: int, layer: int) -> None:
        self.layers_started = step * self.layers + layer + 1
