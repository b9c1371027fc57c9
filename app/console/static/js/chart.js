// Replay cost over time: tokens a finished job computed (prefilled + decoded, all its sessions) against what a
// full reset of the same sessions would have computed. Plain SVG, drawn from the job list's receipts.
import { h, s } from "./dom.js";

export function costPoints(jobs) {
  const points = [];
  for (const job of jobs) {
    if (job.status !== "succeeded" || !job.sessions.length) continue;
    let computed = 0;
    let full = 0;
    for (const r of job.sessions) {
      computed += (r.tokens.prefilled || 0) + (r.tokens.decoded || 0);
      full += r.tokens.full_reset_estimate || 0;
    }
    points.push({ id: job.id, at: new Date(job.finished_at || job.created_at).getTime(), computed, full });
  }
  return points.sort((a, b) => a.at - b.at);
}

export function costChart(points) {
  const width = 720;
  const height = 240;
  const m = { l: 58, r: 16, t: 16, b: 34 };
  if (!points.length) return h("p", { class: "muted" }, "No finished forget job yet: the chart appears with the first receipt.");
  const t0 = points[0].at;
  const t1 = Math.max(points[points.length - 1].at, t0 + 1);
  const ymax = Math.max(1, ...points.map((p) => Math.max(p.computed, p.full)));
  const x = (t) => m.l + ((t - t0) / (t1 - t0)) * (width - m.l - m.r);
  const y = (v) => height - m.b - (v / ymax) * (height - m.t - m.b);
  const series = (field, cls) => s("g", { class: `series ${cls}` },
    s("polyline", { points: points.map((p) => `${x(p.at)},${y(p[field])}`).join(" ") }),
    points.map((p) => s("circle", { cx: x(p.at), cy: y(p[field]), r: 3.5 },
      s("title", { text: `${p.id}: ${p[field]} tokens (${field === "computed" ? "recomputed" : "full reset"})` }))));
  const ticks = [0, 0.5, 1].map((f) => s("g", { class: "tick" },
    s("line", { x1: m.l, x2: width - m.r, y1: y(ymax * f), y2: y(ymax * f) }),
    s("text", { x: m.l - 6, y: y(ymax * f) + 4, "text-anchor": "end" }, String(Math.round(ymax * f)))));
  const svg = s("svg", { class: "chart", viewBox: `0 0 ${width} ${height}`, role: "img",
    "aria-label": "replay cost over time" },
  ticks,
  s("text", { x: m.l, y: height - 10, class: "axis" }, new Date(t0).toLocaleString()),
  s("text", { x: width - m.r, y: height - 10, class: "axis", "text-anchor": "end" }, new Date(t1).toLocaleString()),
  series("full", "full"), series("computed", "computed"));
  const total = (f) => points.reduce((sum, p) => sum + p[f], 0);
  return h("figure", { class: "chart-box" }, svg,
    h("figcaption", {},
      h("span", { class: "key computed" }, "recomputed by the replay"),
      h("span", { class: "key full" }, "a full reset would compute"),
      h("span", { class: "muted" },
        `${points.length} jobs · ${total("computed")} vs ${total("full")} tokens in all`)));
}
