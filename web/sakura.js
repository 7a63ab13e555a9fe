// SAKURA node pack, frontend side:
// * a "choose a published template" button on the Template KV Loader. It reads the pack's route
//   GET /api/sakura/templates?server_url=... (nodes/routes.py) and writes the chosen id into the template_id text
//   field, which stays editable: a typed id works offline;
//   Per-step templates are marked with the step count they serve;
// * widgets that do not apply are hidden (still saved and sent): the link settings the bandwidth mode does not use,
//   the server fields with a local store and the store folder with a server;
// * the Template KV Loader has a read-only box that, once the node ran, shows what it loaded (the text the node
//   returns: template, KV mode and the steps it serves, references, source); at least INFO_MIN_LINES tall, it grows
//   with its text (wrapped lines included) up to INFO_MAX_LINES, then scrolls;
// * a "pair a phone page" button on the Phone Device: it asks ComfyUI for a pairing code (POST
//   /api/sakura/phone/api/code, nodes/page_routes.py) and shows it on the button; the phone opens
//   http://THIS-HOST:PORT/sakura/phone and types it (no QR code: that would need an encoder this pack does not have);
// * a Sakura node added to a graph gets at least MIN_WIDTH_PX, room for each combo's label and its longest value
//   (a loaded workflow keeps the sizes it was saved with; tests/nodes/test_workflows.py checks both).
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";

const NODE = "SakuraTemplateLoader";
const CHOOSE = "choose a published template";
const PAIR = "pair a phone page";
const INFO = "loaded template";
const INFO_LINE_PX = 14; // the status box's line height (its CSS below)
const INFO_CHAR_PX = 6.6; // the advance of its 11 px monospace font
const INFO_MIN_LINES = 8;
const INFO_MAX_LINES = 30;
const INFO_PAD_PX = 10; // the box's padding and border
// node type -> width (px) it gets when added; parsed by tests/nodes/test_workflows.py: keep it one JSON line
const MIN_WIDTH_PX = {"SakuraModelLoader": 360, "SakuraTemplateLoader": 420, "SakuraAdaptiveFetch": 380, "SakuraPipelinedSampler": 480, "SakuraPhoneDevice": 380, "SakuraTemplateKV": 360, "SakuraTemplateKVReport": 320};
// node type -> [the widget deciding, {widget: (its value) => shown}]
const APPLIES = {
  SakuraAdaptiveFetch: ["bandwidth", {
    fixed_mbit_s: (v) => v === "fixed Mbit/s",
    trace: (v) => v === "trace file",
    trace_path: (v) => v === "trace file",
  }],
  SakuraTemplateLoader: ["source", {
    server_url: (v) => v === "server",
    token: (v) => v === "server",
    [CHOOSE]: (v) => v === "server",
    store_dir: (v) => v === "local store",
  }],
};

function applyVisibility(node) {
  const [deciding, rules] = APPLIES[node.comfyClass] ?? [];
  const value = deciding && widget(node, deciding)?.value;
  if (value === undefined) return;
  for (const [name, shown] of Object.entries(rules)) {
    const w = widget(node, name);
    if (w) w.hidden = !shown(value);
  }
  const [, height] = node.computeSize();
  node.setSize([node.size[0], height]);
  node.setDirtyCanvas(true, true);
}

function followVisibility(node) {
  const [deciding] = APPLIES[node.comfyClass] ?? [];
  const w = deciding && widget(node, deciding);
  if (!w) return;
  const changed = w.callback;
  w.callback = function (...args) {
    const r = changed?.apply(this, args);
    applyVisibility(node);
    return r;
  };
  const configured = node.onConfigure;  // a loaded workflow sets the values after nodeCreated
  node.onConfigure = function (...args) {
    const r = configured?.apply(this, args);
    applyVisibility(node);
    return r;
  };
  applyVisibility(node);
}

async function publishedTemplates(serverUrl) {
  const resp = await api.fetchApi(`/sakura/templates?server_url=${encodeURIComponent(serverUrl || "")}`, {
    headers: { "X-Sakura-Request": "1" }, // see nodes/routes.py: keeps other web pages from using the route
  });
  if (!resp.ok) throw new Error(`HTTP ${resp.status} from /sakura/templates`);
  return await resp.json();
}

function widget(node, name) {
  return node.widgets?.find((w) => w.name === name);
}

// what the chooser lists for a template: its id, and the step count a per-step template serves
function templateLabel(t) {
  return t.kv_mode === "per-step" ? `${t.id} (per-step KV: ${t.steps} steps)` : t.id;
}

// lines the status box needs for `text` at the node's width `widthPx` (long lines wrap), within its min and max
function infoLines(text, widthPx) {
  const perLine = Math.max(20, Math.floor((widthPx - 2 * 15 - INFO_PAD_PX) / INFO_CHAR_PX));
  const lines = (text || "").split("\n").reduce((n, line) => n + Math.max(1, Math.ceil(line.length / perLine)), 0);
  return Math.min(INFO_MAX_LINES, Math.max(INFO_MIN_LINES, lines));
}

// the read-only status box, made with the node (so its size is there before the first run)
function infoWidget(node) {
  let w = widget(node, INFO);
  if (w) return w;
  const box = document.createElement("textarea");
  box.readOnly = true;
  box.placeholder = "Run the workflow: what this node loads shows here (template, KV mode, references, source).";
  box.style.cssText = `width:100%;height:100%;box-sizing:border-box;padding:4px;resize:none;overflow:auto;`
    + `font:11px/${INFO_LINE_PX}px monospace;opacity:0.9;white-space:pre-wrap`;
  w = node.addDOMWidget(INFO, "sakura_info", box, {
    getValue: () => box.value,
    setValue: (v) => { box.value = v; },
    getMinHeight: () => infoLines(box.value, node.size[0]) * INFO_LINE_PX + INFO_PAD_PX,
    serialize: false, // not part of the saved widgets_values
  });
  w.serialize = false;
  return w;
}

function showInfo(node, lines) {
  const w = infoWidget(node);
  w.value = lines.join("\n");
  w.element && (w.element.value = w.value);
  node.sakuraInfo = w.value; // for tests and the console
  const [, height] = node.computeSize();
  node.setSize([node.size[0], Math.max(node.size[1], height)]);
  node.setDirtyCanvas(true, true);
}

// a node added to the graph: wide enough for its combos, tall enough for its widgets
function fitNewNode(node) {
  const width = MIN_WIDTH_PX[node.comfyClass];
  if (!width) return;
  const [, height] = node.computeSize();
  node.setSize([Math.max(node.size[0], width), Math.max(node.size[1], height)]);
}

async function chooseTemplate(node, event) {
  const idWidget = widget(node, "template_id");
  const urlWidget = widget(node, "server_url");
  const listing = await publishedTemplates(urlWidget?.value);
  const ids = listing.templates.map((t) => t.id);
  const labels = listing.templates.map(templateLabel);
  node.sakuraPublished = listing; // for tests and the console
  if (!ids.length) {
    const why = listing.error || `no templates are published at ${listing.server_url}`;
    app.extensionManager?.toast?.add({ severity: "warn", summary: "SAKURA", detail: why, life: 6000 });
    return;
  }
  const pick = (value) => {
    idWidget.value = value;
    idWidget.callback?.(value);
    node.setDirtyCanvas(true, true);
  };
  const ContextMenu = window.LiteGraph?.ContextMenu;
  if (ContextMenu) {
    new ContextMenu(labels, {
      event,
      title: `published at ${listing.server_url}`,
      callback: (label) => pick(ids[labels.indexOf(label?.content ?? label)]),
    });
  } else {
    pick(ids[0]);
  }
}

// A fresh pairing code on the button: the phone page (/sakura/phone) takes it within its lifetime.
async function pairPage(button) {
  const resp = await api.fetchApi("/sakura/phone/api/code", { method: "POST", headers: { "X-Sakura-Request": "1" } });
  const body = await resp.json();
  if (!resp.ok) throw new Error(body.error ?? `HTTP ${resp.status}`);
  button.name = `code ${body.code} (${Math.round(body.ttl_s / 60)} min): open /sakura/phone on the phone`;
  app.graph?.setDirtyCanvas(true, false);
}

app.registerExtension({
  name: "sakura.templateChoice",
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (nodeData.name !== NODE) return;
    const executed = nodeType.prototype.onExecuted;
    nodeType.prototype.onExecuted = function (output) {
      const r = executed?.apply(this, arguments);
      if (Array.isArray(output?.text)) showInfo(this, output.text);
      return r;
    };
  },
  async nodeCreated(node) {
    if (node.comfyClass in APPLIES) followVisibility(node);
    if (node.comfyClass === NODE) {
      // appended after every schema widget, so the saved widgets_values keep their order
      const button = node.addWidget("button", CHOOSE, null, (_v, _c, _n, _p, event) => {
        chooseTemplate(node, event).catch((e) => console.error("sakura: template list failed", e));
      });
      button.serialize = false;
      infoWidget(node);
      node.sakuraChooseTemplate = (event) => chooseTemplate(node, event);
      applyVisibility(node);
    }
    if (node.comfyClass === "SakuraPhoneDevice") {
      const button = node.addWidget("button", PAIR, null, () => {
        pairPage(button).catch((e) => { button.name = `${PAIR}: ${e.message}`; });
      });
      button.serialize = false;
    }
    fitNewNode(node); // a loaded workflow then sets the size it was saved with
  },
});
