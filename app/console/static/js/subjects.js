// Data subjects: what is linked to a person, the access request's export, the erasure (a plan, then a confirmation
// with its receipt) and legal holds. Every action is one public /v1 call; nothing is erased without the plan shown.
import { ApiError, api, seg } from "./api.js";
import { badge, flash, h, put, short, table, when } from "./dom.js";

const ENDED = new Set(["succeeded", "failed", "held"]); // held: a hold on the subject placed since; its release runs it
const POLL_MS = 400;

export function subjectsView() {
  const input = h("input", { id: "subject-id", type: "text", required: true, "aria-label": "Subject id",
    placeholder: "your id for the person (an account id, a customer number)" });
  const form = h("form", { class: "toolbar", id: "subject-form" }, input, h("button", { type: "submit" }, "Open"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    window.location.hash = `#/subjects/${seg(input.value.trim())}`;
  });
  return h("div", {}, h("h1", {}, "Subjects"),
    h("p", { class: "muted" }, "A subject is a person the data is about: the sessions that name them, the memory ",
      "namespaces linked to them. Open one to export everything held about them, erase it, or hold it."),
    form);
}

function scope(hold) {
  if (hold.session_id) return h("a", { href: `#/sessions/${seg(hold.session_id)}`, text: `session ${short(hold.session_id)}` });
  if (hold.namespace) return h("a", { href: `#/memory/${seg(hold.namespace)}`, text: `namespace ${hold.namespace}` });
  return "the whole subject";
}

function holdsSection(subject, refresh, status) {
  const reason = h("input", { id: "hold-reason", type: "text", "aria-label": "Reason for the hold",
    placeholder: "a case number (kept in the clear)" });
  const place = h("button", { id: "place-hold", type: "button" }, "Place a legal hold");
  place.addEventListener("click", () => act(status, async () => {
    await api("/v1/holds", { method: "POST", body: { subject_id: subject.id, reason: reason.value.trim() } });
    await refresh();
  }));
  const rows = subject.holds.map((hold) => {
    const release = h("button", { class: "ghost", type: "button", id: `release-${hold.id}` }, "Release");
    release.addEventListener("click", () => act(status, async () => {
      await api(`/v1/holds/${seg(hold.id)}`, { method: "DELETE" });
      await refresh();
    }));
    return h("tr", {}, h("td", {}, h("code", { text: hold.id })), h("td", {}, scope(hold)),
      h("td", { text: hold.reason }), h("td", { text: when(hold.created_at) }), h("td", {}, release));
  });
  return h("div", {}, h("h3", {}, "Legal holds"),
    rows.length ? table(["hold", "covers", "reason", "placed", ""], rows, { id: "holds" })
      : h("p", { class: "muted", id: "no-holds" }, "None: an erasure may proceed."),
    h("div", { class: "toolbar" }, reason, place));
}

async function act(status, work) {
  put(status);
  try {
    await work();
  } catch (error) {
    const hold = error instanceof ApiError && error.problem.hold_id ? ` (hold ${error.problem.hold_id})` : "";
    flash(status, hold ? { message: `${error.message}${hold}` } : error);
  }
}

function exportSection(subject, status) {
  const out = h("div", { id: "export-result" });
  const button = h("button", { id: "export", type: "button", class: "ghost" }, "Export everything held");
  button.addEventListener("click", () => act(status, async () => {
    const doc = await api(`/v1/subjects/${seg(subject.id)}/export`);
    const artifacts = doc.sessions.reduce((n, s) => n + s.artifacts.length, 0);
    const file = new Blob([JSON.stringify(doc, null, 2)], { type: "application/json" });
    put(out, h("p", { id: "export-summary" },
      `${doc.sessions.length} session(s), ${artifacts} artifact(s), ${doc.memory.length} memory value(s), `,
      `${doc.forget_receipts.length} forget receipt(s). `,
      h("a", { href: URL.createObjectURL(file), download: `subject-${subject.id}.json` }, "Download the JSON")));
  }));
  return h("div", {}, h("h3", {}, "Access request"), button, out);
}

function eraseSection(subject, refresh, status) {
  const out = h("div", { id: "erase-result" });
  const plan = h("button", { id: "plan-erase", type: "button" }, "Plan the erasure");
  plan.addEventListener("click", () => act(status, async () => {
    const planned = await api(`/v1/subjects/${seg(subject.id)}/erase`, { method: "POST", body: { dry_run: true } });
    const confirm = h("button", { id: "confirm-erase", type: "button", class: "danger" }, "Confirm: erase it all");
    confirm.addEventListener("click", () => act(status, async () => {
      // The erasure is a job: the answer is the ended job, or (a large subject) the running one, followed here.
      let job = await api(`/v1/subjects/${seg(subject.id)}/erase`, { method: "POST", body: {} });
      while (!ENDED.has(job.status)) {
        put(out, h("p", { id: "erase-running" }, badge(job.status), " erasing…"));
        await new Promise((resolve) => { setTimeout(resolve, POLL_MS); });
        job = await api(`/v1/forget/${seg(job.id)}`);
      }
      const receipt = job.subject
        ? [` ${job.subject.sessions.length} session(s) and ${job.subject.memory_keys} memory key(s) erased; `,
          `${job.subject.held.length} part(s) kept by a hold. `]
        : [` waits on legal hold ${job.hold_id ?? ""}. `];
      put(out, h("p", { id: "erase-receipt" }, badge(job.status), ...receipt,
        h("a", { href: `#/jobs/${seg(job.id)}`, text: "Receipt" })));
      await refresh(out);
    }));
    put(out, h("div", { id: "erase-plan" },
      h("p", {}, `Would erase ${planned.sessions.length} session(s) whole (${planned.conversations.length} `,
        `conversation(s)) and tombstone ${planned.memory_keys} memory key(s) in ${planned.namespaces.length} `,
        "namespace(s)."),
      planned.held.length ? h("p", { id: "plan-held" }, `Kept by a legal hold: ${planned.held.length} part(s).`) : null,
      confirm));
  }));
  return h("div", {}, h("h3", {}, "Erasure request"), plan, out);
}

export async function subjectView(id) {
  const host = h("div", { id: "subject" });
  const status = h("div", { id: "subject-status" });
  async function refresh(keep) {
    const subject = await api(`/v1/subjects/${seg(id)}`);
    const sessions = subject.session_ids.map((sid) => h("li", {}, h("a", { href: `#/sessions/${seg(sid)}`, text: sid })));
    const namespaces = subject.memory_namespaces.map((n) => h("li", {}, h("a", { href: `#/memory/${seg(n)}`, text: n })));
    put(host, h("h1", { text: `Subject ${subject.id}` }),
      h("p", { class: "muted" }, `${subject.sessions} session(s) · made ${when(subject.created_at)}`,
        subject.erased_at ? [" · erased ", when(subject.erased_at)] : null),
      status,
      h("div", { class: "columns" },
        h("div", {}, h("h3", {}, "Sessions"), sessions.length ? h("ul", { id: "subject-sessions" }, sessions)
          : h("p", { class: "muted" }, "None.")),
        h("div", {}, h("h3", {}, "Memory namespaces"), namespaces.length
          ? h("ul", { id: "subject-namespaces" }, namespaces) : h("p", { class: "muted" }, "None linked."))),
      holdsSection(subject, refresh, status), exportSection(subject, status), eraseSection(subject, refresh, status),
      keep || null);
  }
  await refresh();
  return host;
}
