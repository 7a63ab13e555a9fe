"""``sakura`` console script. Each subcommand lives in its own module, imported only when it runs.

A command module defines ``add_arguments(parser)`` and ``run(args) -> int``. Register it in ``COMMANDS``. The
developer commands (``sakura bench|train|eval ...``) live in ``sakura_tools``, which the product never imports and the
wheel leaves out: from a repository install (``pip install -e .``) they load from the checkout next to this package;
elsewhere the command says how to get them. A full,
read-only or forbidden disk (``files.DISK_FAULTS``) and an input that is not an image end any command with one
line and exit 1 / 2, never a traceback (files are written whole or not at all: ``sakura_core.files``).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import sys
from pathlib import Path
from types import ModuleType

from .files import DISK_FAULTS, disk_fault_message
from .images import ImageError

__all__ = ["COMMANDS", "main"]

# words -> (module, one-line help)
COMMANDS: dict[tuple[str, ...], tuple[str, str]] = {
    ("demo",): ("sakura_core.cli_demo", "run an edit of a demo template end to end; writes images + report.json"),
    ("train", "demo-model"): ("sakura_tools.train.cli_train", "train the demo editing model on generated pairs"),
    ("eval", "demo-model"): ("sakura_tools.train.cli_eval", "evaluate the demo model on held-out pairs; writes JSON"),
    ("serve",): ("cloud_server.cli_serve", "run the template/shard server (catalog, manifests, shards, precompute)"),
    ("precompute",): ("cloud_server.cli_precompute", "compute a template's KV ladder and publish it into a store"),
    ("precompute-catalog",): (
        "cloud_server.cli_precompute_catalog",
        "publish every entry of a template catalog (local workers or a Ray cluster); skips what is published",
    ),
    ("examples",): (
        "cloud_server.cli_examples",
        "publish the ComfyUI example workflows' templates into a store; write their user images",
    ),
    ("store",): (
        "cloud_server.cli_store",
        "verify|repair a store (re-hash shards, quarantine, sweep temp/orphans); "
        "usage: bytes stored per template, KV mode and store profile",
    ),
    ("bench", "e2e"): (
        "sakura_tools.bench.cli_e2e",
        "every fetch policy over every trace (sim or live); JSON + plots",
    ),
    ("bench", "serve"): ("sakura_tools.infra.bench_serve", "load-test the shard server vs nginx over loopback; JSON"),
    ("bench", "catalog"): (
        "sakura_tools.infra.bench_catalog",
        "catalog precompute with 1 vs 2 workers; shard GETs from S3 vs local vs nginx CDN (radosgw); JSON",
    ),
    ("bench", "store-catalog"): (
        "sakura_tools.infra.bench_store_catalog",
        "N templates (both KV modes) published into an S3 store: store usage vs the bytes written, store verify; JSON",
    ),
    ("bench", "lossless-top"): (
        "sakura_tools.bench.cli_lossless",
        "lossless top-rung candidates (fp16 zstd, byte planes, XOR on the top rung) vs the storage bound; JSON",
    ),
    ("bench", "listing"): (
        "sakura_tools.infra.bench_listing",
        "GET /v1/templates at 100 / 1,000 / 10,000 templates: cold, warm, relisted; the server's RSS; JSON",
    ),
    ("phone-agent",): ("android_bridge.cli_phone_agent", "run the (emulated) phone agent"),
    ("phone", "run"): ("android_bridge.cli_phone_run", "dispatch one edit to a phone agent; writes the image"),
    ("phone", "devices"): ("android_bridge.cli_phone_devices", "list adb devices, or show a phone agent's info"),
    ("export",): ("android_bridge.cli_export", "demo DiT (cached KV) to ONNX / QNN; op coverage + parity"),
    ("bench", "cross-step"): (
        "sakura_tools.bench.cli_cross_step",
        "per-step KV coded per step vs across steps vs single mode: bytes at equal PSNR; JSON",
    ),
    ("traces", "synth"): (
        "sakura_core.fetch.cli_synth",
        "write synthetic development traces (random walks, on/off links with outages) for policy work",
    ),
    ("bench", "planner"): (
        "sakura_tools.bench.cli_planner",
        "the sakura policy's time per decision and per edit at 4x25, 28x25, 50x25 shards; JSON",
    ),
    ("bench", "scale"): (
        "sakura_tools.bench.cli_scale",
        "CPU seconds and peak memory of one 4 / 28 / 50-step edit simulated with every policy and the bound; JSON",
    ),
    ("bench", "ladder-model"): (
        "sakura_tools.bench.cli_ladder_model",
        "per-step ladders at any step count: a model fitted on the measured ones, its held-out error stated; JSON",
    ),
    ("bench", "slow-links"): (
        "sakura_tools.bench.cli_slow_links",
        "sakura near the fluid bound on slow links: per class vs the bound, the oracle, fetch-nothing; JSON",
    ),
    ("bench", "regime"): (
        "sakura_tools.bench.cli_regime",
        "a policy's speed-up over baselines and its ceiling, over link Mbit/s x device TFLOP/s; JSON",
    ),
    ("bench", "results"): (
        "sakura_tools.bench.cli_results",
        "regenerate docs/results.md's measured results from docs/results/*.json (--check: compare only)",
    ),
    ("bench", "readme"): ("sakura_tools.bench.cli_results", "the old name of `sakura bench results`"),
    ("bench", "codec"): (
        "sakura_tools.bench.cli_codec",
        "every KV codec and ladder level: size, error, PSNR, MB/s; JSON",
    ),
    ("bench", "decode"): (
        "sakura_tools.bench.cli_decode",
        "one decode thread on a phone-scale shard, SAKURA vs CacheGen: fp16 MB/s and Mbit/s of wire; JSON",
    ),
    ("bench", "heldout"): (
        "sakura_tools.bench.cli_heldout",
        "every level's manifest PSNR vs edits precompute never saw; does the quality floor hold; JSON",
    ),
}


#: The developer tools' package (benchmarks, test servers, demo training): a repository checkout's, never installed.
TOOLS = "sakura_tools"
TOOLS_MISSING = (
    "this is a developer command: it lives in the repository's sakura_tools package, which installed copies of SAKURA "
    "(a wheel, the Comfy Registry archive) leave out. Run it from a clone: git clone "
    "https://github.com/sakura-kv/sakura-kv && cd sakura-kv && pip install -e . (or `make venv`)"
)


def _tools_importable() -> bool:
    """Whether ``sakura_tools`` imports: installed, on ``sys.path``, or in the checkout holding this ``sakura_core``
    (an editable install maps only the product's packages; the checkout's tools are loaded from the folder, without
    putting the checkout on ``sys.path``)."""
    if importlib.util.find_spec(TOOLS) is not None:
        return True
    folder = Path(__file__).resolve().parent.parent / TOOLS
    if not (folder / "__init__.py").is_file():
        return False
    spec = importlib.util.spec_from_file_location(
        TOOLS, folder / "__init__.py", submodule_search_locations=[str(folder)]
    )
    if spec is None or spec.loader is None:
        return False
    module = importlib.util.module_from_spec(spec)
    sys.modules[TOOLS] = module
    spec.loader.exec_module(module)
    return True


def _command_module(module_name: str) -> ModuleType | None:
    """A command's module, imported now; None when it is a tools command and no ``sakura_tools`` is at hand."""
    if module_name.split(".")[0] == TOOLS and not _tools_importable():
        return None
    return importlib.import_module(module_name)


def _usage(group: str | None = None) -> str:
    """The command list; with ``group`` (a first word such as ``bench``) only the commands under it."""
    shown = {k: v for k, v in COMMANDS.items() if group is None or (len(k) > 1 and k[0] == group)}
    width = max(len(" ".join(k)) for k in shown)
    rows = "\n".join(f"  sakura {' '.join(k):<{width}}  {help_}" for k, (_, help_) in sorted(shown.items()))
    head = f"sakura {group} COMMAND [options]" if group else "sakura COMMAND [options]"
    return f"usage: {head}\n\ncommands:\n{rows}\n\nsakura COMMAND --help shows a command's options."


def _group(word: str) -> str | None:
    return word if any(len(k) > 1 and k[0] == word for k in COMMANDS) else None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    match = None
    for words in sorted(COMMANDS, key=len, reverse=True):
        if tuple(argv[: len(words)]) == words:
            match = words
            break
    if match is None:
        group = _group(argv[0]) if argv else None
        if group is not None and (len(argv) == 1 or argv[1] in ("-h", "--help")):
            print(_usage(group))
            return 0
        if argv and argv[0] not in ("-h", "--help"):
            print(f"sakura: unknown command {' '.join(argv[:2])!r}\n", file=sys.stderr)
            print(_usage(), file=sys.stderr)
            return 2
        print(_usage())
        return 0
    module_name, help_ = COMMANDS[match]
    module = _command_module(module_name)
    if module is None:
        print(f"sakura {' '.join(match)}: {TOOLS_MISSING}", file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(prog="sakura " + " ".join(match), description=help_)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    module.add_arguments(parser)
    args = parser.parse_args(argv[len(match) :])
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(module.run(args) or 0)
    except KeyboardInterrupt:
        print("sakura: interrupted", file=sys.stderr)
        return 130
    except OSError as e:
        if e.errno not in DISK_FAULTS:
            raise
        print(f"sakura {' '.join(match)}: {disk_fault_message(e)}", file=sys.stderr)
        return 1
    except ImageError as e:  # an input that is not an image (any command that takes one)
        print(f"sakura {' '.join(match)}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
