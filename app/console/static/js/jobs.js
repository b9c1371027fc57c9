// Forget jobs (status, receipts, the replay-cost chart) and detector-webhook deliveries.
import { api, seg } from "./api.js";
import { costChart, costPoints } from "./chart.js";
import { badge, h, put, short, table, when } from "./dom.js";
import { receiptView } from "./receipt.js";

function targetText(target) {
  if (target.artifact_id) return `artifact ${short(target.artifact_id)}`;
  if (target.memory) return `memory ${target.memory.namespace}/${target.memory.key}`;
  for (const form of ["text", "keyword", "query"]) {
    if (form in target) return typeof target[form] === "number" ? `${form} (${target[form]} chars)` : `${form}`;
  }
  if (target.artifact_ids) return `${target.artifact_ids.length} artifacts`;
  return JSON.stringify(target);
}

function jobRow(job) {
  const computed = job.sessions.reduce((n, r) => n + (r.tokens.prefilled || 0) + (r.tokens.decoded || 0), 0);
  const full = job.sessions.reduce((n, r) => n + r.tokens.full_reset_estimate, 0);
  return h("tr", {},
    h("td", {}, h("a", { href: `#/jobs/${seg(job.id)}`, class: "mono", text: job.id })),
    h("td", { text: when(job.created_at) }),
    h("td", {}, badge(job.status)),
    h("td", { text: job.strategy }),
    h("td", { text: targetText(job.target) }),
    h("td", { class: "num", text: job.sessions.length }),
    h("td", { class: "num", text: job.sessions.reduce((n, r) => n + r.transitions_replayed, 0) }),
    h("td", { class: "num", text: job.status === "succeeded" ? computed : "" }),
    h("td", { class: "num", text: job.sessions.length ? full : "" }),
    h("td", { class: "num", text: job.duration_ms ?? "" }));
}

export async function jobsView() {
  const state = { status: "", cursors: [null], page: 0 };
  const body = h("div", {});
  const chartHost = h("div", { id: "cost-chart" });
  const status = h("select", { id: "filter-job-status", "aria-label": "status" },
    ["", "planned", "queued", "running", "succeeded", "failed", "needs_input"]
      .map((o) => h("option", { value: o }, o || "any status")));
  const prev = h("button", { type: "button", class: "ghost" }, "← Newer");
  const next = h("button", { type: "button", class: "ghost" }, "Older →");
  const load = async () => {
    const page = await api("/v1/forget", { params: { limit: 25, cursor: state.cursors[state.page],
      status: state.status } });
    state.cursors[state.page + 1] = page.next_cursor;
    prev.disabled = state.page === 0;
    next.disabled = !page.next_cursor;
    put(body, page.jobs.length
      ? table(["job", "created", "status", "strategy", "target", "sessions", "replayed", "computed", "full reset",
        "ms"], page.jobs.map(jobRow), { id: "jobs-table" })
      : h("p", { class: "muted" }, "No forget job."));
  };
  const chart = async () => {
    const jobs = [];
    let cursor = null;
    do {  // the newest 500 succeeded jobs are plenty for a trend
      const page = await api("/v1/forget", { params: { limit: 100, cursor, status: "succeeded" } });
      jobs.push(...page.jobs);
      cursor = page.next_cursor;
    } while (cursor && jobs.length < 500);
    put(chartHost, costChart(costPoints(jobs)));
  };
  status.addEventListener("change", () => { state.status = status.value; state.cursors = [null]; state.page = 0; load(); });
  prev.addEventListener("click", () => { state.page -= 1; load(); });
  next.addEventListener("click", () => { state.page += 1; load(); });
  await Promise.all([load(), chart()]);
  return h("div", {},
    h("h1", {}, "Forget jobs"),
    h("h3", {}, "Replay cost over time"), chartHost,
    h("div", { class: "toolbar" }, status, prev, next), body);
}

export async function jobView(id) {
  const job = await api(`/v1/forget/${seg(id)}`);
  return h("div", {}, h("h1", {}, "Forget job"),
    h("p", {}, h("span", { class: "muted" }, "target: "), targetText(job.target),
      job.reason ? h("span", { class: "muted" }, ` · reason: ${job.reason}`) : null,
      h("span", { class: "muted" }, ` · created ${when(job.created_at)} · finished ${when(job.finished_at)}`)),
    receiptView(job));
}

export async function webhooksView() {
  const state = { cursors: [null], page: 0 };
  const body = h("div", {});
  const prev = h("button", { type: "button", class: "ghost" }, "← Newer");
  const next = h("button", { type: "button", class: "ghost" }, "Older →");
  const load = async () => {
    const page = await api("/v1/webhooks/deliveries", { params: { limit: 25, cursor: state.cursors[state.page] } });
    state.cursors[state.page + 1] = page.next_cursor;
    prev.disabled = state.page === 0;
    next.disabled = !page.next_cursor;
    const rows = page.deliveries.map((d) => h("tr", {},
      h("td", { class: "mono", text: d.webhook_id }),
      h("td", { text: when(d.received_at) }),
      h("td", {}, d.forget_id ? h("a", { href: `#/jobs/${seg(d.forget_id)}`, class: "mono", text: d.forget_id }) : "–"),
      h("td", {}, d.forget_status ? badge(d.forget_status) : "–")));
    put(body, rows.length
      ? table(["webhook-id", "received", "forget job", "job status"], rows, { id: "deliveries-table" })
      : h("p", { class: "muted" }, "No detector-webhook delivery yet."));
  };
  prev.addEventListener("click", () => { state.page -= 1; load(); });
  next.addEventListener("click", () => { state.page += 1; load(); });
  await load();
  return h("div", {}, h("div", { class: "toolbar" }, h("h1", {}, "Detector-webhook deliveries"), prev, next), body);
}
