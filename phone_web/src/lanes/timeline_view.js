// The lanes' timeline drawn in the page: one row per lane (fetch, decode, compute, stall), each event a bar from its
// start to its end (seconds since the edit started), into an <svg> that scales to its box (a phone's width).

const LANES = ["fetch", "decode", "compute", "stall"];
const COLORS = { fetch: "#3b7dd8", decode: "#2aa876", compute: "#e08a00", stall: "#c0392b" };
const NS = "http://www.w3.org/2000/svg";

/** Draw ``timeline`` (report.timeline) into ``svg`` (its children replaced); returns the bars drawn. */
export function drawTimeline(svg, timeline) {
  const end = Math.max(1e-3, ...timeline.map((e) => e.end));
  const W = 400;
  const rowH = 16;
  const label = 56;
  svg.setAttribute("viewBox", `0 0 ${W} ${LANES.length * rowH + 14}`);
  svg.setAttribute("preserveAspectRatio", "none");
  const el = (name, attrs, text = null) => {
    const x = document.createElementNS(NS, name);
    for (const [k, v] of Object.entries(attrs)) x.setAttribute(k, String(v));
    if (text !== null) x.textContent = text;
    return x;
  };
  const kids = [];
  LANES.forEach((lane, i) => kids.push(el("text", { x: 2, y: i * rowH + 11, "font-size": 10 }, lane)));
  let bars = 0;
  for (const e of timeline) {
    const i = LANES.indexOf(e.lane);
    if (i < 0) continue;
    const x = label + ((W - label) * e.start) / end;
    const w = Math.max(0.5, ((W - label) * (e.end - e.start)) / end);
    const bar = el("rect", { x, y: i * rowH + 2, width: w, height: rowH - 4, fill: COLORS[e.lane] });
    bar.append(el("title", {}, `${e.lane} shard ${e.layer} ${e.level}: ${e.start.toFixed(3)}-${e.end.toFixed(3)} s`));
    kids.push(bar);
    bars += 1;
  }
  kids.push(el("text", { x: W - 2, y: LANES.length * rowH + 11, "font-size": 10, "text-anchor": "end" }, `${end.toFixed(2)} s`));
  svg.replaceChildren(...kids);
  svg.dataset.bars = String(bars);
  return bars;
}
