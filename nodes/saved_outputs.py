"""Where the sampler saves a run's report and timeline: in ComfyUI's output folder, next to the edited image.

The Save Image node names the edited image ``<prefix>_<n>_.png`` (``n`` counts up per prefix); the sampler runs
before it and saves ``<prefix>_report_<n>.json`` and ``<prefix>_timeline_<n>.png`` with the ``n`` that image will
get. Those names do not count as images of the prefix for ComfyUI's counter (a word, not a number, follows the
prefix), so the Save Image node still picks that ``n``.
"""

from __future__ import annotations

import logging
import os

import numpy as np

from ._common import SakuraNodeError

__all__ = ["save_run_files"]

logger = logging.getLogger(__name__)


def save_run_files(prefix: str, report_text: str, timeline: np.ndarray) -> list[str]:
    """Write the report (JSON text) and the timeline ((H, W, 3) uint8) under ``prefix`` in ComfyUI's output folder;
    returns their paths relative to it (none when ``prefix`` is empty)."""
    import folder_paths

    from sakura_core.files import atomic_write_bytes, save_png

    prefix = prefix.strip()
    if not prefix:
        return []
    output_dir = folder_paths.get_output_directory()
    try:
        folder, name, counter, subfolder, _ = folder_paths.get_save_image_path(prefix, output_dir)
    except Exception as e:  # ComfyUI raises a bare Exception for a prefix outside the output folder
        raise SakuraNodeError(
            f"save_prefix {prefix!r}: {e}; give a folder/name inside ComfyUI's output folder, e.g. sakura/edit"
        ) from e
    os.makedirs(folder, exist_ok=True)
    report_path = os.path.join(folder, f"{name}_report_{counter:05}.json")
    timeline_path = os.path.join(folder, f"{name}_timeline_{counter:05}.png")
    atomic_write_bytes(report_path, report_text.encode())
    save_png(timeline_path, timeline)
    saved = [os.path.relpath(p, output_dir) for p in (report_path, timeline_path)]
    logger.info("sakura: saved %s (subfolder %r of the output folder)", ", ".join(saved), subfolder)
    return saved
