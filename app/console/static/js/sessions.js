// Sessions list: newest first, keyset pages, filters by status and context policy.
import { api, seg } from "./api.js";
import { badge, h, put, short, table } from "./dom.js";

export async function sessionsView() {
  const state = { status: "", policy: "", cursors: [null], page: 0 };
  const body = h("div", {});
  const pick = (id, label, options, key) => {
    const select = h("select", { id, "aria-label": label },
      options.map((o) => h("option", { value: o }, o || `any ${label}`)));
    select.addEventListener("change", () => {
      state[key] = select.value;
      state.cursors = [null];
      state.page = 0;
      load();
    });
    return select;
  };
  const prev = h("button", { type: "button", class: "ghost", id: "prev-page" }, "← Newer");
  const next = h("button", { type: "button", class: "ghost", id: "next-page" }, "Older →");
  const load = async () => {
    const page = await api("/v1/sessions", { params: { limit: 20, cursor: state.cursors[state.page],
      status: state.status, context_policy: state.policy } });
    state.cursors[state.page + 1] = page.next_cursor;
    prev.disabled = state.page === 0;
    next.disabled = !page.next_cursor;
    const rows = page.sessions.map((ses) => h("tr", {},
      h("td", {}, h("a", { href: `#/sessions/${seg(ses.id)}`, class: "mono", title: ses.id }, ses.id)),
      h("td", {}, badge(ses.status)),
      h("td", { text: ses.context_policy }),
      h("td", { class: "num", text: ses.turns }),
      h("td", { class: "num", text: ses.token_count }),
      h("td", { text: ses.memory_namespace || "" }),
      h("td", { class: "mono", text: ses.pending_tool_calls.length ? short(ses.pending_tool_calls[0].id) : "" })));
    put(body, rows.length
      ? table(["session", "status", "policy", "turns", "tokens", "memory namespace", "pending call"], rows,
        { id: "sessions-table" })
      : h("p", { class: "muted" }, "No session matches."));
  };
  prev.addEventListener("click", () => { state.page -= 1; load(); });
  next.addEventListener("click", () => { state.page += 1; load(); });
  await load();
  return h("div", {},
    h("div", { class: "toolbar" }, h("h1", {}, "Sessions"),
      pick("filter-status", "status", ["", "idle", "running", "forgetting"], "status"),
      pick("filter-policy", "policy", ["", "full", "retrieval"], "policy"), prev, next),
    body);
}
