// Memory: namespaces, their keys (tombstones included, by name), a key's versions. A forgotten value never shows:
// the API erased it, history included.
import { api, seg } from "./api.js";
import { badge, h, when, table } from "./dom.js";

async function namespaces() {
  const all = [];
  let cursor = null;
  do {
    const page = await api("/v1/memory", { params: { limit: 200, cursor } });
    all.push(...page.namespaces);
    cursor = page.next_cursor;
  } while (cursor && all.length < 2000);
  return all;
}

async function keysOf(namespace) {
  const keys = [];
  const forgotten = new Set();
  let cursor = null;
  do {
    const page = await api(`/v1/memory/${seg(namespace)}`, { params: { limit: 500, cursor, include_forgotten: true } });
    keys.push(...page.keys);
    page.forgotten.forEach((k) => forgotten.add(k));
    cursor = page.next_cursor;
  } while (cursor && keys.length < 5000);
  return { keys, forgotten };
}

async function keyDetail(namespace, key) {
  // History first: a tombstone at its end means the key is forgotten, so the head (a 404) need not be asked for.
  const history = await api(`/v1/memory/${seg(namespace)}/${seg(key)}/history`);
  const last = history.versions[history.versions.length - 1];
  let current;
  if (!last) current = h("p", { id: "key-head" }, "Never written.");
  else if (last.op === "forget") {
    current = h("p", { id: "key-head" }, badge("forgotten"),
      ` tombstone version ${last.version}: the value is gone, history included.`);
  } else {
    const head = await api(`/v1/memory/${seg(namespace)}/${seg(key)}`);
    current = h("div", { id: "key-head" }, h("p", {}, `version ${head.version} · ${head.source} · ${when(head.updated_at)}`),
      h("pre", { class: "json" }, JSON.stringify(head.value, null, 2)));
  }
  const rows = history.versions.map((v) => h("tr", { class: v.op === "forget" ? "tombstone" : "" },
    h("td", { class: "num", text: v.version }),
    h("td", {}, v.op === "forget" ? badge("tombstone") : "write"),
    h("td", { text: v.source }),
    h("td", { text: when(v.at) }),
    h("td", {}, v.op === "forget" ? h("span", { class: "muted" }, "—")
      : v.erased || v.value === null || v.value === undefined
        ? h("span", { class: "muted erased" }, "erased by a later forget")
        : h("code", { text: JSON.stringify(v.value) }))));
  return h("div", { class: "key-detail" }, h("h3", { text: `${namespace} / ${key}` }), current,
    table(["version", "op", "source", "at", "value"], rows, { id: "history" }));
}

export async function memoryView(namespace, key) {
  const list = await namespaces();
  const nsRows = list.map((n) => h("tr", { class: n.namespace === namespace ? "selected" : "" },
    h("td", {}, h("a", { href: `#/memory/${seg(n.namespace)}`, text: n.namespace })),
    h("td", { class: "num", text: n.live_keys }),
    h("td", { class: "num", text: n.forgotten_keys }),
    h("td", { text: when(n.updated_at) })));
  const columns = [h("div", {}, h("h1", {}, "Memory"), list.length
    ? table(["namespace", "live keys", "forgotten", "last change"], nsRows, { id: "namespaces" })
    : h("p", { class: "muted" }, "No memory record yet."))];
  if (namespace) {
    const { keys, forgotten } = await keysOf(namespace);
    columns.push(h("div", {}, h("h3", { text: namespace }),
      h("ul", { class: "keys", id: "keys" }, keys.map((k) => h("li", { class: k === key ? "selected" : "" },
        h("a", { href: `#/memory/${seg(namespace)}/${seg(k)}`, text: k }),
        forgotten.has(k) ? [" ", badge("forgotten")] : null)))));
  }
  if (namespace && key) columns.push(await keyDetail(namespace, key));
  return h("div", { class: "columns" }, columns);
}
