"""The example workflows, defined once here and written in both of ComfyUI's formats:

* ``example_workflows/<name>.json`` — UI format (``nodes`` + ``links``), what ComfyUI's template browser opens;
* ``example_workflows/api/<name>.json`` — API format (``{id: {class_type, inputs}}``), what ``POST /prompt`` takes.

and ``example_workflows/<name>.jpg``, the thumbnail ComfyUI's template browser shows (the template, the user image
and the demo model's edit of them). Regenerate after changing a node's inputs (``test_workflows.py`` fails until the
files match; ``--no-thumbnails`` skips the images)::

    .venv/bin/python tests/nodes/workflows.py

``TEST_WORKFLOWS`` are built the same way but never shipped: the tests run them (``render``) against templates they
publish, e.g. a template of two reference images (``publish_two_references``), which the demo model, trained with one
reference, edits with blended textures.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "example_workflows"
SERVER_URL = "http://127.0.0.1:8080"
PHONE_URL = "http://127.0.0.1:8765"
PROMPT = "place it in the marked region"

# ComfyUI's own nodes used here: (socket inputs [(name, type)], widgets [(name, default)], outputs [(name, type)])
CORE_NODES = {
    "LoadImage": ([], [("image", None), ("upload", "image")], [("IMAGE", "IMAGE"), ("MASK", "MASK")]),
    "SaveImage": ([("images", "IMAGE")], [("filename_prefix", "ComfyUI")], []),
    "PreviewImage": ([("images", "IMAGE")], [], []),
    "PreviewAny": ([("source", "*")], [], []),
    "ImageScaleBy": (
        [("image", "IMAGE")],
        [("upscale_method", "nearest-exact"), ("scale_by", 1.0)],
        [("IMAGE", "IMAGE")],
    ),
    "Note": ([], [("text", "")], []),
}
API_ONLY_WIDGETS = {"upload"}  # UI-only widget values that /prompt does not take
UI_ONLY_NODES = {"Note"}  # frontend-only (virtual) nodes: not part of what /prompt runs


@dataclass
class Node:
    id: int
    type: str
    title: str
    pos: tuple[int, int]
    values: dict = field(default_factory=dict)  # widget values (by input id) and links: ("node id", output slot)
    size: tuple[int, int] | None = None  # (width, height); None: SIZES[type]


# (width, height) each node is saved with (the body, below its 30 px title): room for its widgets' labels and values
# and the status box, large image previews; at least test_workflows.py's minimum per type, nothing overlapping at the
# positions in _chain
SIZES = {
    "SakuraModelLoader": (360, 170), "SakuraTemplateLoader": (420, 330), "SakuraAdaptiveFetch": (380, 230),
    "SakuraPipelinedSampler": (480, 330), "SakuraPhoneDevice": (380, 130), "LoadImage": (360, 420),
    "SaveImage": (400, 170), "PreviewImage": (800, 420), "PreviewAny": (480, 420), "ImageScaleBy": (360, 110),
    "Note": (420, 520),
}  # fmt: skip # keep: a table of node sizes
ENLARGE = 8.0  # the demo model's 64 px edit shown at 512 px: ComfyUI's previews never scale an image up
SETUP = (
    "Before Run (docs/comfyui.md, 'The shipped workflows'):\n"
    "  sakura examples --store ~/sakura-store --comfyui-input ComfyUI/input\n"
    "  sakura serve --store ~/sakura-store --port 8080\n"
)


MEASURED = "this machine (measured)"
PHONE_CPU = "emulated phone: snapdragon-8-elite-cpu"


def _chain(
    template_id: str,
    user_file: str,
    prefix: str,
    about: str,
    policy="sakura",
    bandwidth="live",
    mbit=20.0,
    trace="norway_bus_1",
    phone: bool = False,
    steps: int = 8,
    timing: str = MEASURED,
) -> list[Node]:
    """Columns left to right: inputs (model, user image) | template, notes | fetch (+ phone) | sampler, report |
    the edited image (enlarged for viewing, saved at its size), timeline."""
    nodes = [
        Node(1, "SakuraModelLoader", "Sakura Model Loader", (40, 60), {"model_name": "demo (embedded)"}),
        Node(2, "SakuraTemplateLoader", "Sakura Template KV Loader", (440, 60),
             {"model": (1, 0), "template_id": template_id, "source": "server", "server_url": SERVER_URL,
              "token": "", "store_dir": ""}),
        Node(3, "SakuraAdaptiveFetch", "Sakura Bandwidth-Adaptive Fetch", (900, 60),
             {"template": (2, 0), "policy": policy, "bandwidth": bandwidth, "fixed_mbit_s": mbit, "trace": trace,
              "trace_path": ""}),
        Node(4, "LoadImage", "Private user image", (40, 300), {"image": user_file, "upload": "image"}),
        Node(5, "SakuraPipelinedSampler", "Sakura Pipelined DiT Sampler", (1320, 60),
             {"model": (1, 0), "kv_stream": (3, 0), "image": (4, 0), "prompt": PROMPT, "steps": steps, "seed": 0,
              "save_prefix": prefix, "device_timing": timing}),
        Node(6, "SaveImage", "Edited image (saved at 64x64, the demo model's size)", (2240, 60),
             {"images": (5, 0), "filename_prefix": prefix}),
        Node(7, "PreviewImage", "Pipeline timeline", (1840, 910), {"images": (5, 2)}),
        Node(8, "PreviewAny", "Report (JSON)", (1320, 450), {"source": (5, 1)}),
        Node(11, "ImageScaleBy", f"Enlarge x{ENLARGE:g} for viewing", (1840, 60),
             {"image": (5, 0), "upscale_method": "nearest-exact", "scale_by": ENLARGE}),
        Node(12, "PreviewImage", f"Edited image (x{ENLARGE:g}, nearest)", (1840, 290), {"images": (11, 0)},
             size=(560, 560)),
    ]  # fmt: skip # keep: a workflow's node table: one node a row
    if phone:
        nodes.append(
            Node(
                9,
                "SakuraPhoneDevice",
                "Sakura Phone Device",
                (900, 350),
                {"connection": PHONE_URL, "token": "", "cloud_url": ""},
            )
        )
        nodes[4].values["device"] = (9, 0)
    nodes.append(Node(10, "Note", "About this workflow", (440, 450), {"text": about + "\n\n" + SETUP}))
    return nodes


MEASURED_WHY = (
    "Why sakura computes here: device_timing is 'this machine (measured)', and this CPU runs a layer of the tiny "
    "demo model in milliseconds, faster than any link delivers its KV: sakura may fetch a probe shard, then the "
    "summary says 'used none: computing was faster here' (levels_used 'none used') — the right call on this "
    "machine. To see fetching win, set the sampler's "
    "device_timing to 'emulated phone: snapdragon-8-elite-cpu' (with an emulated link), or open the per-step face "
    "swap."
)
EMULATED_HOW = (
    "EMULATED timing: the sampler's device_timing paces each layer to a Snapdragon 8 Elite CPU running a "
    "phone-class DiT (24 layers; each demo layer stands for 4) and slows the emulated link to phone-size shards "
    "(x171); the image is still the demo model's, computed here. The report's summary says 'EMULATED', "
    "executed_on.timing has the numbers."
)

WORKFLOWS = {
    "sakura_face_swap": _chain(
        "face-swap-astronaut",
        "sakura-face.png",
        "sakura/face-swap",
        "SAKURA face swap: puts the face in 'Private user image' into the marked region of the template "
        "'face-swap-astronaut'. The template's attention KV was precomputed by the SAKURA server and streams in "
        "over the live network while the DiT runs; your image and prompt never leave this machine.\n\n" + MEASURED_WHY,
    ),
    "sakura_in_context_edit": _chain(
        "in-context-coffee",
        "sakura-object.png",
        "sakura/in-context",
        "SAKURA in-context edit: places the object of 'Private user image' into the cup region of the template "
        "'in-context-coffee', with the template KV over an emulated 10 Mbit/s link.\n\n" + MEASURED_WHY,
        bandwidth="fixed Mbit/s",
        mbit=10.0,
    ),
    "sakura_in_context_edit_on_phone": _chain(
        "in-context-coffee",
        "sakura-object.png",
        "sakura/on-phone",
        "SAKURA in-context edit on a phone: the same edit, dispatched to a paired phone (Sakura Phone Device): the "
        "user image and prompt go to the phone only, and the phone fetches the template KV from the server itself. "
        "Start the phone agent with the pairing token, and ComfyUI with the same $SAKURA_PHONE_TOKEN:\n"
        "  SAKURA_PHONE_TOKEN=... sakura phone-agent --port 8765\n\n"
        "Why sakura computes: the emulated phone agent is this machine's CPU running the tiny demo model, which "
        "computes a layer faster than the 10 Mbit/s link brings its KV ('every layer computed here'); the report's "
        "executed_on.simulated_phone section gives the SIMULATED latency on the agent's phone profile.",
        bandwidth="fixed Mbit/s",
        mbit=10.0,
        phone=True,
    ),
    "sakura_face_swap_per_step": _chain(
        "face-swap-astronaut-per-step",
        "sakura-face.png",
        "sakura/face-swap-per-step",
        "SAKURA face swap with per-step template KV: the template 'face-swap-astronaut-per-step' holds one KV per "
        "(step, layer) for a 4-step schedule — what a stock editing DiT, whose template tokens take part in every "
        "step, reuses. The Template KV Loader shows the mode and schedule; the sampler runs 4 steps (another step "
        "count is refused: precompute the template for it). Shards of step s+1 stream while step s computes.\n\n"
        + EMULATED_HOW
        + "\n\nWhy sakura fetches: at 50 Mbit/s a phone-size shard arrives faster than the phone "
        "computes that layer's template tokens. Step 0 computes its first layer while the rest stream in (split "
        "at layer 1), every later (step, layer) is fetched at the level the policy picks per shard (the quality "
        "floor: step 0 at sakura-l1, each later step as its closed-loop twin sakura-l1+cl; layer 0, computed at "
        "step 0, off that track at an open-loop level): ~21 s vs ~36 s for on-device (levels_used and "
        "split_layers in the report; the timeline's lanes).",
        bandwidth="fixed Mbit/s",
        mbit=50.0,
        steps=4,
        timing=PHONE_CPU,
    ),
}

# a template of two reference images, as `sakura precompute --image A --image B --reference-name ...` publishes it:
# (its id, [(reference name, scikit-image sample)] in the model's order)
TWO_REFERENCES = ("two-references", [("person", "astronaut"), ("garment", "rocket")])

# built and run by the tests (test_multi_reference.py, the real-ComfyUI tests), never shipped: the multi-reference
# path through every node, its KV one block over both references, with EMULATED phone timing over a 50 Mbit/s link,
# where fetching beats the phone computing both references
TEST_WORKFLOWS = {
    "sakura_two_references": _chain(
        TWO_REFERENCES[0],
        "sakura-object.png",
        "sakura/two-references",
        "SAKURA with a template of two reference images (a test workflow, not shipped: the demo model was trained "
        "with one reference, so it blends the second one's texture into its edit). The Template KV Loader lists "
        "both references; their KV is one block, the references attending to each other.\n\n" + EMULATED_HOW,
        bandwidth="fixed Mbit/s",
        mbit=50.0,
        steps=4,
        timing=PHONE_CPU,
    ),
}


def publish_two_references(store, model) -> None:
    """Publish ``TWO_REFERENCES`` for ``model`` into ``store`` (a Store or a local store folder) unless it is there."""
    from cloud_server.precompute import publish_template
    from cloud_server.store import LocalStore, Store
    from sakura_core.models.edit_model import load_image

    store = store if isinstance(store, Store) else LocalStore(store)
    template_id, refs = TWO_REFERENCES
    if not store.has_template(template_id):
        images = [load_image(sample, model.spec.image_size) for _, sample in refs]
        publish_template(store, model, images, template_id, reference_names=[n for n, _ in refs], store_profile="full")


def node_interface(class_type: str, schemas: dict) -> tuple[list, list, list]:
    """(socket inputs [(name, type, optional)], widgets [(name, control_after_generate)], outputs [(name, type)])."""
    if class_type in CORE_NODES:
        sockets, widgets, outputs = CORE_NODES[class_type]
        return [(n, t, False) for n, t in sockets], [(n, False) for n, _ in widgets], outputs
    schema = schemas[class_type]
    widget_types = {"INT", "FLOAT", "STRING", "COMBO", "BOOLEAN"}
    sockets = [(i.id, i.io_type, bool(i.optional)) for i in schema.inputs if i.io_type not in widget_types]
    widgets = [
        (i.id, bool(getattr(i, "control_after_generate", False))) for i in schema.inputs if i.io_type in widget_types
    ]
    outputs = [(o.display_name or o.io_type, o.io_type) for o in schema.outputs]
    return sockets, widgets, outputs


def widget_defaults(class_type: str, schemas: dict) -> dict:
    """``{widget name: default}`` of a node type: what the frontend shows (and sends) for a widget not set here."""
    if class_type in CORE_NODES:
        return dict(CORE_NODES[class_type][1])
    widgets = {"INT", "FLOAT", "STRING", "COMBO", "BOOLEAN"}
    out = {}
    for i in schemas[class_type].inputs:
        if i.io_type in widgets:
            if i.default is None:
                raise ValueError(f"{class_type}.{i.id} has no default: give it one in the schema or a value here")
            out[i.id] = i.default
    return out


def completed(nodes: list[Node], schemas: dict) -> list[Node]:
    """The nodes with every widget not set in the definition at its schema default: a saved workflow must never hold
    ``null`` for a widget (ComfyUI's frontend would send it, and the backend rejects it)."""
    out = []
    for node in nodes:
        defaults = widget_defaults(node.type, schemas)
        values = {**node.values, **{k: v for k, v in defaults.items() if k not in node.values}}
        out.append(Node(node.id, node.type, node.title, node.pos, values, node.size))
    return out


def api_format(nodes: list[Node]) -> dict:
    out = {}
    for node in nodes:
        if node.type in UI_ONLY_NODES:
            continue
        inputs = {}
        for name, value in node.values.items():
            if name in API_ONLY_WIDGETS:
                continue
            inputs[name] = [str(value[0]), value[1]] if isinstance(value, tuple) else value
        out[str(node.id)] = {"class_type": node.type, "inputs": inputs, "_meta": {"title": node.title}}
    return out


def ui_format(nodes: list[Node], schemas: dict) -> dict:
    links: list[list] = []
    by_id = {n.id: n for n in nodes}
    out_links: dict[tuple[int, int], list[int]] = {}
    ui_nodes = []
    for order, node in enumerate(nodes):
        sockets, widgets, outputs = node_interface(node.type, schemas)
        inputs = []
        for slot, (name, io_type, optional) in enumerate(sockets):
            link = None
            if name in node.values:
                src, src_slot = node.values[name]
                link = len(links) + 1
                src_type = node_interface(by_id[src].type, schemas)[2][src_slot][1]
                links.append([link, src, src_slot, node.id, slot, src_type])
                out_links.setdefault((src, src_slot), []).append(link)
            entry = {"name": name, "type": io_type, "link": link}
            if optional:
                entry["shape"] = 7  # the frontend's hollow dot for optional inputs
            inputs.append(entry)
        values = []
        for name, control in widgets:
            values.append(node.values[name])
            if control:
                values.append("fixed")
        ui_nodes.append(
            {
                "id": node.id,
                "type": node.type,
                "pos": list(node.pos),
                "size": list(node.size or SIZES[node.type]),
                "flags": {},
                "order": order,
                "mode": 0,
                "title": node.title,
                "inputs": inputs,
                "outputs": [
                    {"name": name, "type": io_type, "links": None, "slot_index": slot}
                    for slot, (name, io_type) in enumerate(outputs)
                ],
                "properties": {"Node name for S&R": node.type},
                "widgets_values": values,
            }
        )
    for ui in ui_nodes:
        for out in ui["outputs"]:
            out["links"] = out_links.get((ui["id"], out["slot_index"]))
    return {
        "last_node_id": max(n.id for n in nodes),
        "last_link_id": len(links),
        "nodes": ui_nodes,
        "links": links,
        "groups": [],
        "config": {},
        "extra": {},
        "version": 0.4,
    }


def render(name: str, schemas: dict) -> tuple[dict, dict]:
    """(UI format, API format) of the workflow ``name`` of ``WORKFLOWS`` or ``TEST_WORKFLOWS``."""
    nodes = completed({**WORKFLOWS, **TEST_WORKFLOWS}[name], schemas)
    return ui_format(nodes, schemas), api_format(nodes)


def render_all(schemas: dict) -> dict[Path, str]:
    """``{path: file text}`` of every example workflow in both formats."""
    files = {}
    for name in WORKFLOWS:
        ui, api = render(name, schemas)
        files[OUT / f"{name}.json"] = json.dumps(ui, indent=2) + "\n"
        files[OUT / "api" / f"{name}.json"] = json.dumps(api, indent=2) + "\n"
    return files


def sakura_schemas() -> dict:
    """The Sakura nodes' schemas, read through the stand-in ComfyUI API in ``tests/nodes/stubs``."""
    import asyncio
    import importlib.util

    sys.path.insert(0, str(Path(__file__).resolve().parent / "stubs"))
    spec = importlib.util.spec_from_file_location(
        "sakura_custom_node", REPO / "__init__.py", submodule_search_locations=[str(REPO)]
    )
    pkg = importlib.util.module_from_spec(spec)
    sys.modules["sakura_custom_node"] = pkg
    spec.loader.exec_module(pkg)
    classes = asyncio.run(asyncio.run(pkg.comfy_entrypoint()).get_node_list())
    return {c.GET_SCHEMA().node_id: c.GET_SCHEMA() for c in classes}


def thumbnail(nodes: list[Node], model) -> bytes:
    """``<name>.jpg`` for the template browser (256 x 256): the template (marked region) and the user image on the left,
    the demo model's edit of them on the right (computed on this machine, template every step)."""
    import io

    from PIL import Image, ImageDraw

    from cloud_server.examples import KV_SETTINGS, template_image, user_image
    from sakura_core.models.edit_model import load_image
    from sakura_core.runtime.denoise import run_edit

    by_type = {n.type: n for n in nodes}
    template_id = by_type["SakuraTemplateLoader"].values["template_id"]
    template = template_image(template_id, model.spec)
    kv_mode = KV_SETTINGS.get(template_id, {}).get("kv_mode", "single")
    steps = by_type["SakuraPipelinedSampler"].values["steps"]
    user = load_image(user_image(by_type["LoadImage"].values["image"]), model.spec.image_size)
    L = model.adapter.num_layers
    edited = run_edit(
        model,
        user,
        PROMPT,
        steps=steps,
        seed=0,
        split_layer=L,
        template_image=template,
        template_every_step=kv_mode == "per-step",
        kv_mode=kv_mode,
    ).image
    canvas = Image.new("RGB", (256, 256), (24, 24, 28))
    for image, box in ((template, (4, 4, 124, 124)), (user, (4, 132, 124, 252)), (edited, (132, 68, 252, 188))):
        tile = Image.fromarray(image).resize((box[2] - box[0], box[3] - box[1]), Image.Resampling.NEAREST)
        canvas.paste(tile, box[:2])
    draw = ImageDraw.Draw(canvas)
    draw.line([(124, 64), (132, 128), (124, 192)], fill=(235, 140, 170), width=3)  # both inputs -> the edit
    out = io.BytesIO()
    canvas.save(out, "JPEG", quality=88)
    return out.getvalue()


if __name__ == "__main__":
    for path, text in render_all(sakura_schemas()).items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    if "--no-thumbnails" not in sys.argv:
        from sakura_core.models.edit_model import load_demo_model

        demo = load_demo_model()
        for name, chain in WORKFLOWS.items():
            (OUT / f"{name}.jpg").write_bytes(thumbnail(chain, demo))
