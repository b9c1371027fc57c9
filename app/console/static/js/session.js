// One session: its artifacts as a provenance graph and as a transcript, and the forget planner: pick a target,
// see the dry-run plan on the graph (τ, the closure with each node's reason, memory, other sessions, the cost),
// confirm with a strategy, follow the job, read the receipt.
import { api, seg } from "./api.js";
import { badge, clear, flash, h, put, short } from "./dom.js";
import { drawGraph } from "./graph.js";
import { costBar, memorySection, receiptView } from "./receipt.js";

const STRATEGIES = ["selective_replay", "full_reset", "delete_dependents", "no_forget", "memory_delete",
  "forget_instruction", "source_redaction", "sanitize_no_replay", "sanitized_rebuild"];
const FINAL = new Set(["succeeded", "failed", "needs_input", "held"]);
const POLL_MS = 400;

function transcript(artifacts, onSelect) {
  return h("ol", { class: "transcript", id: "transcript" }, artifacts.map((a) => {
    const item = h("li", { class: `msg kind-${a.kind}`, "data-id": a.id },
      h("div", { class: "msg-head" },
        h("span", { class: "kind", text: a.kind }),
        h("span", { class: "muted", text: `turn ${a.turn} · tokens [${a.token_span[0]}, ${a.token_span[1]})` }),
        h("span", { class: "mono muted", title: a.id, text: short(a.id) }),
        h("span", { class: "why" })),
      h("div", { class: "content", text: a.content }));
    item.addEventListener("click", () => {
      if (!String(window.getSelection() || "").trim()) onSelect(a.id);
    });
    return item;
  }));
}

export async function sessionView(id) {
  const [session, listing] = await Promise.all([
    api(`/v1/sessions/${seg(id)}`), api(`/v1/sessions/${seg(id)}/artifacts`)]);
  let artifacts = listing.artifacts;
  let selected = null;
  let plan = null;
  let graph = null;

  const info = h("div", { class: "toolbar" });
  const graphHost = h("div", { class: "graph-host", id: "graph" });
  const transcriptHost = h("div", { class: "transcript-host", hidden: true });
  const detail = h("div", { class: "detail", id: "artifact-detail" });
  const planHost = h("div", { id: "plan" });
  const jobHost = h("div", { id: "job" });

  const describe = () => {
    put(info, h("h1", { class: "mono", text: session.id }), badge(session.status),
      h("span", { class: "muted" },
        `${session.context_policy} · ${session.turns} turns · ${session.token_count} tokens · epoch ${session.epoch}`),
      session.memory_namespace
        ? h("a", { href: `#/memory/${seg(session.memory_namespace)}` }, `memory: ${session.memory_namespace}`) : null);
  };

  const mark = () => {
    const why = new Map(((plan && plan.trace) || []).map((t) => [t.artifact_id, t.why]));
    if (graph) {
      graph.highlight(plan ? plan.trace : null);
      graph.select(selected);
    }
    for (const item of transcriptHost.querySelectorAll(".msg")) {
      const aid = item.getAttribute("data-id");
      const reason = why.get(aid);
      item.classList.toggle("selected", aid === selected);
      item.classList.toggle("target", reason === "target");
      item.classList.toggle("closure", reason !== undefined && reason !== "target");
      item.querySelector(".why").textContent = reason ? `forget: ${reason}` : "";
    }
  };

  const select = (aid) => {
    selected = aid;
    if (targetKind.value !== "memory") targetKind.value = "artifact";
    syncTarget();
    const a = artifacts.find((x) => x.id === aid);
    clear(detail);
    if (a) {
      detail.append(h("div", {}, h("h4", {}, `${a.kind} · turn ${a.turn} · tokens [${a.token_span[0]}, ${a.token_span[1]})`),
        h("p", { class: "mono muted", text: a.id }),
        h("div", { class: "content", text: a.content }),
        a.parents.length ? h("p", { class: "muted" }, `parents: ${a.parents.map(short).join(", ")}`) : null,
        a.memory ? h("p", {}, "injected from ", h("a", { href: `#/memory/${seg(a.memory.namespace)}/${seg(a.memory.key)}` },
          `${a.memory.namespace}/${a.memory.key} v${a.memory.version}`)) : null));
    }
    mark();
  };

  const redraw = () => {
    graph = drawGraph(graphHost, artifacts, { onSelect: select });
    put(transcriptHost, transcript(artifacts, select));
    mark();
  };

  // Tabs: the graph and the transcript of the same artifacts.
  const tabGraph = h("button", { type: "button", class: "tab active", id: "tab-graph" }, "Provenance graph");
  const tabText = h("button", { type: "button", class: "tab", id: "tab-transcript" }, "Transcript");
  const show = (which) => {
    graphHost.hidden = which !== "graph";
    transcriptHost.hidden = which !== "transcript";
    tabGraph.classList.toggle("active", which === "graph");
    tabText.classList.toggle("active", which === "transcript");
  };
  tabGraph.addEventListener("click", () => show("graph"));
  tabText.addEventListener("click", () => show("transcript"));

  // The forget planner.
  const targetKind = h("select", { id: "target-kind", "aria-label": "target" },
    h("option", { value: "artifact" }, "the selected artifact"),
    h("option", { value: "text" }, "a text span"),
    h("option", { value: "keyword" }, "a keyword search"),
    h("option", { value: "query" }, "a meaning (query)"),
    h("option", { value: "memory" }, "its memory record (all sessions)"));
  const targetText = h("input", { id: "target-text", type: "text", placeholder: "text, keyword or query",
    "aria-label": "target text" });
  const useSelection = h("button", { type: "button", class: "ghost", id: "use-selection",
    title: "Select words in the transcript first" }, "Use the text selected in the transcript");
  const strategy = h("select", { id: "strategy", "aria-label": "strategy" },
    STRATEGIES.map((name) => h("option", { value: name }, name)));
  const preview = h("button", { type: "button", id: "preview" }, "Preview (dry run)");
  const syncTarget = () => {
    targetText.hidden = targetKind.value === "artifact" || targetKind.value === "memory";
    useSelection.hidden = targetKind.value !== "text";
  };
  targetKind.addEventListener("change", syncTarget);
  useSelection.addEventListener("click", () => {
    const text = String(window.getSelection() || "").trim();
    if (text) targetText.value = text;
  });
  // Remember a selection made inside the transcript: clicking the button would otherwise clear it first.
  transcriptHost.addEventListener("mouseup", () => {
    const text = String(window.getSelection() || "").trim();
    if (text) {
      targetKind.value = "text";
      targetText.value = text;
      syncTarget();
    }
  });

  const target = () => {
    if (targetKind.value === "artifact") {
      if (!selected) throw new Error("Pick an artifact on the graph or in the transcript first.");
      return { artifact_id: selected };
    }
    if (targetKind.value === "memory") {
      const a = artifacts.find((x) => x.id === selected);
      if (!a || !a.memory) throw new Error("Pick a memory artifact (kind memory, at turn 0) first.");
      return { memory: { namespace: a.memory.namespace, key: a.memory.key } };
    }
    const words = targetText.value.trim();
    if (!words) throw new Error("Type the text, keyword or query to forget.");
    return { session_id: session.id, [targetKind.value]: words };
  };

  const renderPlan = (job, forTarget) => {
    const mine = job.sessions.find((r) => r.session_id === session.id);
    const others = job.sessions.filter((r) => r.session_id !== session.id);
    plan = mine || null;
    mark();
    const confirm = h("button", { type: "button", id: "confirm", class: "danger" },
      `Confirm: forget with ${job.strategy}`);
    confirm.addEventListener("click", () => run(forTarget, job.strategy, confirm));
    const trace = mine && mine.trace ? mine.trace : [];
    put(planHost, h("div", { class: "plan" },
      h("h3", {}, "Plan (dry run: nothing changed yet)"),
      mine ? h("p", { id: "plan-summary" },
        `τ = ${mine.tau} of T = ${mine.T} · closure of ${mine.closure.length} artifacts · `,
        `${mine.T - mine.tau + 1} transitions to replay`) : h("p", { class: "muted" }, "This session is not reached."),
      mine ? costBar(mine.tokens.recompute_estimate ?? 0, mine.tokens.full_reset_estimate) : null,
      trace.length ? h("ol", { class: "trace", id: "trace" }, trace.map((step) => {
        const li = h("li", { class: step.why === "target" ? "target" : "closure" },
          h("span", { class: "kind", text: step.kind }), ` t${step.turn} `,
          h("span", { class: "mono", text: short(step.artifact_id) }), " — ", h("span", { class: "why", text: step.why }));
        li.addEventListener("click", () => { if (graph) graph.focus(step.artifact_id); select(step.artifact_id); });
        return li;
      })) : null,
      memorySection(job),
      others.length ? h("div", {}, h("h4", {}, "Other sessions reached"), h("ul", { id: "other-sessions" },
        others.map((r) => h("li", {}, h("a", { href: `#/sessions/${seg(r.session_id)}`, class: "mono" }, r.session_id),
          ` τ = ${r.tau}, ${r.closure.length} artifacts, ~${r.tokens.recompute_estimate ?? "?"} tokens`)))) : null,
      h("div", { class: "toolbar" }, confirm, h("span", { class: "muted" }, "runs the job; the receipt follows"))));
  };

  const run = async (forTarget, chosen, button) => {
    button.disabled = true;
    clear(jobHost);
    const progress = h("div", { class: "progress", id: "progress" });
    jobHost.append(progress);
    const started = performance.now();
    try {
      let job = await api("/v1/forget", { method: "POST", body: { target: forTarget, strategy: chosen,
        reason: "operator console" } });
      const seen = [];
      while (true) {
        if (seen[seen.length - 1] !== job.status) seen.push(job.status);
        put(progress, h("span", {}, "Job ", h("span", { class: "mono", text: job.id }), " ",
          seen.map((st, i) => [i ? " → " : "", badge(st)]),
          h("span", { class: "muted" }, ` ${((performance.now() - started) / 1000).toFixed(1)} s`)));
        if (FINAL.has(job.status)) break;
        await new Promise((resolve) => { setTimeout(resolve, POLL_MS); });
        job = await api(`/v1/forget/${seg(job.id)}`);
      }
      jobHost.append(receiptView(job));
      plan = null;
      selected = null;
      clear(planHost);
      clear(detail);
      const [fresh, again] = await Promise.all([
        api(`/v1/sessions/${seg(session.id)}`), api(`/v1/sessions/${seg(session.id)}/artifacts`)]);
      Object.assign(session, fresh);
      artifacts = again.artifacts;
      describe();
      redraw();
    } catch (error) {
      flash(jobHost, error);
    }
  };

  preview.addEventListener("click", async () => {
    clear(planHost);
    clear(jobHost);
    try {
      const forTarget = target();
      const job = await api("/v1/forget", { method: "POST",
        body: { target: forTarget, strategy: strategy.value, dry_run: true } });
      renderPlan(job, forTarget);
    } catch (error) {
      plan = null;
      mark();
      flash(planHost, error);
    }
  });

  describe();
  syncTarget();
  const page = h("div", {}, info,
    h("div", { class: "split" },
      h("div", { class: "left" }, h("div", { class: "tabs" }, tabGraph, tabText), graphHost, transcriptHost),
      h("aside", { class: "right" },
        h("h3", {}, "Forget"),
        h("label", {}, "Target ", targetKind), targetText, useSelection,
        h("label", {}, "Strategy ", strategy), preview, detail, planHost, jobHost)));
  // The graph measures its box to fit, so draw it once the page is in the document.
  requestAnimationFrame(redraw);
  return page;
}
