// The provenance DAG of a session drawn in SVG: one column per transition, artifacts in log order down a column,
// an edge from every stored parent. Wheel zooms around the pointer, dragging pans; hundreds of nodes stay cheap.
import { clear, h, s } from "./dom.js";

const W = 168;
const H = 56;
const GAP_X = 74;
const GAP_Y = 14;
const PAD = 24;

function snippet(text, n) {
  const flat = (text || "").replace(/\s+/g, " ").trim();
  return flat.length > n ? `${flat.slice(0, n - 1)}…` : flat;
}

export function drawGraph(host, artifacts, { onSelect }) {
  clear(host);
  const byId = new Map();
  const rows = new Map();
  for (const a of artifacts) {
    const row = rows.get(a.turn) || 0;
    rows.set(a.turn, row + 1);
    byId.set(a.id, { a, x: PAD + a.turn * (W + GAP_X), y: PAD + row * (H + GAP_Y) });
  }
  const edges = s("g", { class: "edges" });
  const nodes = s("g", { class: "nodes" });
  const world = s("g", { class: "world" }, edges, nodes);
  const svg = s("svg", { class: "graph", role: "img", "aria-label": "provenance graph" }, world);
  const edgeEls = [];
  const nodeEls = new Map();

  for (const { a, x, y } of byId.values()) {
    for (const parent of a.parents) {
      const p = byId.get(parent);
      if (!p) continue;
      const sameColumn = p.a.turn === a.turn;
      const x1 = p.x + W;
      const y1 = p.y + H / 2;
      const x2 = sameColumn ? x + W : x;
      const y2 = y + H / 2;
      const bend = sameColumn ? 36 : Math.max(30, (x2 - x1) / 2);
      const d = `M${x1},${y1} C${x1 + bend},${y1} ${sameColumn ? x2 + bend : x2 - bend},${y2} ${x2},${y2}`;
      const el = s("path", { d, class: "edge", "data-from": parent, "data-to": a.id });
      edgeEls.push(el);
      edges.append(el);
    }
    const title = s("title", { text: `${a.kind} · turn ${a.turn} · ${a.id}\n${snippet(a.content, 160)}` });
    const tokens = a.token_span[1] - a.token_span[0];
    const node = s("g", { class: `node kind-${a.kind}`, "data-id": a.id, transform: `translate(${x},${y})` },
      title,
      s("rect", { width: W, height: H, rx: 6 }),
      s("text", { x: 8, y: 15, class: "k" }, `${a.kind} · turn ${a.turn}`),
      s("text", { x: 8, y: 30, class: "span" }, `tokens [${a.token_span[0]}, ${a.token_span[1]}) · ${tokens}`),
      s("text", { x: 8, y: 47, class: "c" }, snippet(a.content, 24) || "∅"));
    nodeEls.set(a.id, { node, title, base: title.textContent });
    nodes.append(node);
  }

  const columns = Math.max(1, ...[...rows.keys()].map((t) => t + 1));
  const height = Math.max(1, ...rows.values());
  const world_w = PAD * 2 + columns * (W + GAP_X);
  const world_h = PAD * 2 + height * (H + GAP_Y);
  let view = { k: 1, x: 0, y: 0 };
  const apply = () => world.setAttribute("transform", `translate(${view.x},${view.y}) scale(${view.k})`);
  const fit = () => {
    const box = svg.getBoundingClientRect();
    const k = Math.min(1.2, Math.max(0.05, Math.min(box.width / world_w, box.height / world_h)));
    view = { k, x: (box.width - world_w * k) / 2, y: 0 };
    apply();
  };
  const zoomAt = (factor, cx, cy) => {
    const k = Math.min(4, Math.max(0.05, view.k * factor));
    view = { k, x: cx - ((cx - view.x) * k) / view.k, y: cy - ((cy - view.y) * k) / view.k };
    apply();
  };
  svg.addEventListener("wheel", (event) => {
    event.preventDefault();
    const box = svg.getBoundingClientRect();
    zoomAt(Math.exp(-event.deltaY * 0.0015), event.clientX - box.left, event.clientY - box.top);
  }, { passive: false });
  let drag = null;
  svg.addEventListener("pointerdown", (event) => {
    drag = { x: event.clientX, y: event.clientY, vx: view.x, vy: view.y, moved: false };
  });
  svg.addEventListener("pointermove", (event) => {
    if (!drag) return;
    const dx = event.clientX - drag.x;
    const dy = event.clientY - drag.y;
    if (!drag.moved && Math.hypot(dx, dy) < 4) return;
    if (!drag.moved) svg.setPointerCapture(event.pointerId);
    drag.moved = true;
    view = { ...view, x: drag.vx + dx, y: drag.vy + dy };
    apply();
  });
  svg.addEventListener("pointerup", (event) => {
    const wasDrag = drag && drag.moved;
    drag = null;
    if (wasDrag) return;
    const node = event.target.closest && event.target.closest(".node");
    if (node) onSelect(node.getAttribute("data-id"));
  });

  const tools = h("div", { class: "graph-tools" },
    h("button", { type: "button", class: "ghost", title: "Zoom in", onclick: () => zoomAt(1.25, 200, 150) }, "+"),
    h("button", { type: "button", class: "ghost", title: "Zoom out", onclick: () => zoomAt(0.8, 200, 150) }, "−"),
    h("button", { type: "button", class: "ghost", onclick: fit }, "Fit"),
    h("span", { class: "muted" }, `${artifacts.length} artifacts · drag to pan, wheel to zoom`));
  host.append(tools, svg);
  requestAnimationFrame(fit);

  return {
    select(id) {
      for (const [nid, { node }] of nodeEls) node.classList.toggle("selected", nid === id);
    },
    highlight(trace) {
      const why = new Map((trace || []).map((step) => [step.artifact_id, step.why]));
      svg.classList.toggle("planning", why.size > 0);
      for (const [nid, { node, title, base }] of nodeEls) {
        const reason = why.get(nid);
        node.classList.toggle("target", reason === "target");
        node.classList.toggle("closure", reason !== undefined && reason !== "target");
        title.textContent = reason ? `${base}\nforget: ${reason}` : base;
      }
      for (const el of edgeEls) {
        el.classList.toggle("tainted", why.has(el.getAttribute("data-from")) && why.has(el.getAttribute("data-to")));
      }
    },
    focus(id) {
      const spot = byId.get(id);
      if (!spot) return;
      const box = svg.getBoundingClientRect();
      view = { ...view, x: box.width / 2 - (spot.x + W / 2) * view.k, y: box.height / 2 - (spot.y + H / 2) * view.k };
      apply();
    },
  };
}
