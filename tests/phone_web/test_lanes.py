"""The page's lanes (``phone_web/src/lanes``) under node with a fake link, decoder, DiT step and template pass
(``phone_web/test/run_lanes.mjs``): the policy's levels fetched in execution order, each step computed with its own
step's KV at the level reported, the lanes overlapped, per-step KV freed, the prefetch within its budget (and beyond
it without one), decisions with reason codes, the template kept per layer and the late-shard race won by a resumed
template pass, a shard's chain requested in one round trip, the compute profile measured (the template pass included)
and handed to the next edit of a page session, on-device fetching nothing (and refused without a template pass), and
requests ahead (the default): on a link with a round trip, the wire goes from one shard to the next without idling
(one request at a time it idles a round trip between them), a fetcher that does not await its turns turns it off, and
a per-step template's cross-step levels: residuals and closed-loop twins decoded with their reference as the device
holds it (fetched, or made by the template pass), twins only on their track, no reuse rung, nothing held after the
edit."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from ci_deps import require_or_skip

WEB = Path(__file__).resolve().parents[2] / "phone_web"
NODE = shutil.which("node")


def test_the_lanes_run_every_scenario():
    require_or_skip(NODE is not None, "node is not installed (apt-get install nodejs npm)")
    require_or_skip((WEB / "node_modules" / "fzstd").is_dir(), "phone_web's npm packages are not installed (npm ci)")
    proc = subprocess.run([NODE, "test/run_lanes.mjs"], capture_output=True, text=True, timeout=300, cwd=WEB)
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    assert lines and "summary" in lines[-1], proc.stdout[-2000:] + proc.stderr[-2000:]
    failed = [x for x in lines[:-1] if not x["ok"]]
    assert proc.returncode == 0 and not failed, failed
    assert lines[-1]["summary"]["scenarios"] == 16
