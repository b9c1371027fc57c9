// A forget job's plan or receipt: per session τ, the closure, tokens and state hashes; memory and side effects.
import { seg } from "./api.js";
import { badge, h, s, short, table } from "./dom.js";

export function costBar(computed, full) {
  const max = Math.max(1, computed, full);
  // Bar widths are SVG attributes: no inline style under the Content-Security-Policy.
  const bar = (label, value, cls) => h("div", { class: "bar-row" },
    h("span", { class: "bar-label", text: label }),
    s("svg", { class: "bar", viewBox: "0 0 100 10", preserveAspectRatio: "none" },
      s("rect", { width: (100 * value) / max, height: 10, class: cls })),
    h("span", { class: `num tokens-${cls}`, text: `${value} tokens` }));
  const saved = full > 0 ? Math.round(100 * (1 - computed / full)) : 0;
  return h("div", { class: "cost" },
    bar("selective replay", computed, "computed"), bar("full reset", full, "full"),
    h("div", { class: "muted" }, full > 0 ? `${saved}% fewer tokens than a full reset` : ""));
}

function sideEffects(title, items) {
  if (!items || !items.length) return h("p", { class: "muted" }, `${title}: none`);
  return h("div", {}, h("h4", { text: title }), h("pre", { class: "json" }, JSON.stringify(items, null, 2)));
}

export function memorySection(job) {
  const parts = [];
  if (job.memory) {
    const m = job.memory;
    parts.push(h("p", {}, "Memory record: ",
      h("a", { href: `#/memory/${seg(m.namespace)}/${seg(m.key)}` }, `${m.namespace}/${m.key}`),
      m.tombstone_version ? ` (tombstone v${m.tombstone_version})` : ""));
  }
  if (job.derived_memory && job.derived_memory.length) {
    parts.push(h("div", { class: "derived" }, h("h4", {}, "Derived memory reached"),
      h("ul", {}, job.derived_memory.map((d) => h("li", {},
        h("a", { href: `#/memory/${seg(d.namespace)}/${seg(d.key)}` }, `${d.namespace}/${d.key}`),
        d.tombstone_version ? ` tombstone v${d.tombstone_version}` : "")))));
  }
  return parts;
}

export function receiptView(job) {
  const rows = job.sessions.map((r) => h("tr", {},
    h("td", {}, h("a", { href: `#/sessions/${seg(r.session_id)}`, class: "mono", title: r.session_id },
      short(r.session_id))),
    h("td", { class: "num", text: r.tau }),
    h("td", { class: "num", text: r.T }),
    h("td", { class: "num replayed", text: r.transitions_replayed }),
    h("td", { class: "num", text: r.closure.length }),
    h("td", { class: "num", text: r.tokens.reused }),
    h("td", { class: "num", text: (r.tokens.prefilled || 0) + (r.tokens.decoded || 0) }),
    h("td", { class: "num", text: r.tokens.full_reset_estimate }),
    h("td", { class: "num", text: `${r.epoch_before} → ${r.epoch_after ?? "–"}` })));
  const hashes = job.sessions.map((r) => h("dl", { class: "hashes" },
    h("dt", {}, `state before (${short(r.session_id)})`), h("dd", { class: "mono sha-before" }, r.state_sha256_before || "–"),
    h("dt", {}, "state after"), h("dd", { class: "mono sha-after" }, r.state_sha256_after || "–")));
  const total = job.sessions.reduce((acc, r) => ({
    computed: acc.computed + (r.tokens.prefilled || 0) + (r.tokens.decoded || 0),
    full: acc.full + r.tokens.full_reset_estimate }), { computed: 0, full: 0 });
  return h("div", { class: "receipt", id: "receipt" },
    h("div", { class: "toolbar" }, h("h3", {}, "Receipt"), badge(job.status),
      h("a", { href: `#/jobs/${seg(job.id)}`, class: "mono" }, job.id),
      h("span", { class: "muted" }, `${job.strategy} · ${job.duration_ms ?? "–"} ms`)),
    job.error ? h("div", { class: "error", role: "alert" }, job.error) : null,
    job.sessions.length
      ? h("div", { class: "scroll" }, table(["session", "τ", "T", "transitions replayed", "closure", "reused",
        "computed", "full reset", "epoch"], rows))
      : h("p", { class: "muted" }, "No session was touched."),
    job.sessions.length ? costBar(total.computed, total.full) : null,
    hashes,
    memorySection(job),
    sideEffects("Side effects suppressed (not fired again)", job.suppressed_side_effects),
    sideEffects("Side effects committed", job.committed_side_effects),
    job.pending ? h("pre", { class: "json" }, JSON.stringify(job.pending, null, 2)) : null);
}
