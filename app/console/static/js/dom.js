// Tiny DOM helpers. Text always goes in as text nodes: artifact contents are untrusted (users, documents, the model).
const SVG_NS = "http://www.w3.org/2000/svg";

function fill(el, attrs, children) {
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") el.addEventListener(name.slice(2), value);
    else if (name === "text") el.textContent = String(value);
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function h(tag, attrs = {}, ...children) {
  return fill(document.createElement(tag), attrs, children);
}

export function s(tag, attrs = {}, ...children) {
  return fill(document.createElementNS(SVG_NS, tag), attrs, children);
}

export function clear(el) {
  while (el.firstChild) el.firstChild.remove();
  return el;
}

export function short(id) {
  return id && id.length > 14 ? `${id.slice(0, 4)}…${id.slice(-6)}` : id;
}

export function when(iso) {
  return iso ? new Date(iso).toLocaleString() : "";
}

export function table(headers, rows, attrs = {}) {
  return h("table", attrs,
    h("thead", {}, h("tr", {}, headers.map((t) => h("th", { text: t })))),
    h("tbody", {}, rows));
}

export function badge(status) {
  return h("span", { class: `badge st-${status}`, text: status });
}

export function flash(host, error) {
  host.append(h("div", { class: "error", role: "alert" }, error && error.message ? error.message : String(error)));
}

// Replace an element's children (nested arrays flattened, null/false skipped, strings as text).
export function put(el, ...children) {
  clear(el);
  return fill(el, {}, children);
}
