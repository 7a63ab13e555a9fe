"""web/sakura.js without a browser: the extension run under Node.js against a stand-in of the few frontend calls it
makes (``app.registerExtension``, a node's ``addWidget`` / ``addDOMWidget`` / ``computeSize`` / ``setSize``). Checks
the Template KV Loader's status box (at least INFO_MIN_LINES tall before and after a run, growing to its text, then
scrolling) and the width a Sakura node gets when a user adds it. The real frontend runs it in
test_comfyui_frontend.py."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from ci_deps import require_or_skip

WEB_JS = Path(__file__).resolve().parents[2] / "web" / "sakura.js"
NODE = shutil.which("node")
# Node.js is on every machine CI runs on (with CI=true a missing one fails instead of skipping)
require_or_skip(NODE is not None, "the web/sakura.js checks need Node.js (`node` on PATH)", allow_module_level=True)

# A LiteGraph node as far as sakura.js uses it: widgets stack 24 px rows, a DOM widget its getMinHeight; the title and
# one slot row above them. Prints what the scenario returns, as JSON.
HARNESS = """
const source = require("fs").readFileSync(process.argv[2], "utf8").replace(/^import .*$/gm, "");
let extension;
const app = { registerExtension: (e) => { extension = e; } };
const api = { fetchApi: async () => { throw new Error("no server here"); } };
globalThis.document = { createElement: () => ({ style: {}, value: "" }) };
new Function("app", "api", source)(app, api);

class Node {
  constructor(comfyClass, widgetNames) {
    this.comfyClass = comfyClass;
    this.size = [200, 100];
    this.widgets = widgetNames.map((name) => ({ name, value: name === "source" ? "server" : "" }));
  }
  addWidget(type, name, value, callback) { const w = { type, name, value, callback }; this.widgets.push(w); return w; }
  addDOMWidget(name, type, element, options) {
    const w = { name, type, element, options };
    Object.defineProperty(w, "value", { get: options.getValue, set: options.setValue });
    this.widgets.push(w);
    return w;
  }
  computeSize() {
    const rows = this.widgets.filter((w) => !w.hidden)
      .reduce((h, w) => h + (w.options?.getMinHeight ? w.options.getMinHeight() + 4 : 24), 0);
    return [150, 20 + rows];
  }
  setSize(size) { this.size = size; }
  setDirtyCanvas() {}
}

async function scenario() {
  const loader = new Node("SakuraTemplateLoader", ["template_id", "source", "server_url", "token", "store_dir"]);
  await extension.nodeCreated(loader);
  const box = loader.widgets.find((w) => w.type === "sakura_info");
  const before = { size: loader.size, box: box.options.getMinHeight(), info: loader.sakuraInfo ?? null };
  const proto = {};
  await extension.beforeRegisterNodeDef({ prototype: proto }, { name: "SakuraTemplateLoader" });
  const run = (lines) => {
    proto.onExecuted.call(loader, { text: lines });
    return { size: loader.size, box: box.options.getMinHeight(), info: loader.sakuraInfo };
  };
  const short = run(["template: a", "source: server"]);
  const long = run(Array.from({ length: 14 }, (_, i) => `line ${i}`));
  const wrapped = run(["x".repeat(400)]);
  const huge = run(Array.from({ length: 100 }, (_, i) => `line ${i}`));
  const sampler = new Node("SakuraPipelinedSampler", ["prompt", "steps", "seed", "save_prefix", "device_timing"]);
  await extension.nodeCreated(sampler);
  const other = new Node("KSampler", ["seed"]);
  await extension.nodeCreated(other);
  const widgets = loader.widgets.map((w) => [w.name, w.serialize ?? true]);
  return { before, short, long, wrapped, huge, sampler: sampler.size, other: other.size, widgets };
}
scenario().then((r) => console.log(JSON.stringify(r)), (e) => { console.error(e); process.exit(1); });
"""


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    harness = tmp_path_factory.mktemp("sakura-js") / "harness.cjs"
    harness.write_text(HARNESS)
    done = subprocess.run([NODE, str(harness), str(WEB_JS)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _box_px(lines: int) -> int:
    return lines * 14 + 10  # INFO_LINE_PX per line + INFO_PAD_PX


def _loader_px(box_px: int) -> int:
    """The stand-in loader's height: a slot row, 4 widgets and the button (store_dir is hidden with a server), the box."""
    return 20 + 5 * 24 + box_px + 4


def test_the_status_box_is_there_before_the_first_run(result):
    before = result["before"]
    assert before["info"] is None  # nothing loaded yet: the box shows its placeholder
    assert before["box"] == _box_px(8)  # INFO_MIN_LINES, not the 2 lines a tester saw
    assert before["size"] == [420, _loader_px(_box_px(8))]


def test_the_status_box_grows_to_its_text(result):
    assert result["short"]["box"] == _box_px(8) and result["short"]["info"] == "template: a\nsource: server"
    assert result["long"]["box"] == _box_px(14)  # every line shown
    assert result["long"]["size"] == [420, _loader_px(_box_px(14))]  # the node grew with it
    per_line = (420 - 30 - 10) // 6.6  # the node's width in 11 px monospace characters
    assert result["wrapped"]["box"] == _box_px(max(8, int(-(-400 // per_line))))  # a long line wraps
    assert result["huge"]["box"] == _box_px(30)  # INFO_MAX_LINES, then it scrolls


def test_the_status_box_and_button_are_not_saved(result):
    """Both follow the schema's widgets, so the saved ``widgets_values`` keep their order, and neither is saved."""
    names = [name for name, _ in result["widgets"]]
    assert names[:5] == ["template_id", "source", "server_url", "token", "store_dir"]
    assert result["widgets"][5:] == [["choose a published template", False], ["loaded template", False]]


def test_a_new_node_gets_its_width(result):
    assert result["sampler"][0] == 480  # MIN_WIDTH_PX: device_timing's label and longest value uncut
    assert result["other"] == [200, 100]  # ComfyUI's own nodes are left alone
