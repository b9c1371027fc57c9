// The console's shell: sign-in, navigation and hash routes. Every view calls only the public /v1 API.
import { ApiError, api, auth } from "./api.js";
import { clear, flash, h, put } from "./dom.js";
import { jobView, jobsView, webhooksView } from "./jobs.js";
import { memoryView } from "./memory.js";
import { sessionView } from "./session.js";
import { sessionsView } from "./sessions.js";
import { subjectView, subjectsView } from "./subjects.js";

const view = document.getElementById("view");
const nav = document.getElementById("nav");
const signOut = document.getElementById("sign-out");
let generation = 0;

function loginView(message) {
  nav.hidden = true;
  signOut.hidden = true;
  const input = h("input", { id: "api-key", type: "password", autocomplete: "off", required: true,
    placeholder: "API key", "aria-label": "API key" });
  const status = h("div", { id: "login-status" });
  if (message) status.append(h("div", { class: "error", role: "alert" }, message));
  const form = h("form", { class: "login", id: "login-form" },
    h("h1", {}, "Sign in"),
    h("p", { class: "muted" },
      "Paste an API key of your tenant (", h("code", {}, "lethe tenant create"), "). It stays in this tab's session ",
      "storage and goes only to this server, as the bearer token."),
    input,
    h("button", { type: "submit", id: "sign-in" }, "Sign in"),
    status);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    clear(status);
    auth.set(input.value.trim());
    try {
      await api("/v1/sessions", { params: { limit: 1 } });
      window.location.hash = "#/sessions";
      route();
    } catch (error) {
      auth.clear();
      const text = error instanceof ApiError && error.status === 401
        ? `This API key was refused (401): ${error.problem.detail || error.problem.title}`
        : String(error.message || error);
      status.append(h("div", { class: "error", role: "alert", id: "login-error" }, text));
    }
  });
  put(view, form);
  input.focus();
}

const routes = [
  [/^#\/sessions\/([^/]+)$/, (m) => sessionView(decodeURIComponent(m[1])), "sessions"],
  [/^#\/sessions$/, () => sessionsView(), "sessions"],
  [/^#\/memory(?:\/([^/]+))?(?:\/([^/]+))?$/, (m) => memoryView(m[1] && decodeURIComponent(m[1]),
    m[2] && decodeURIComponent(m[2])), "memory"],
  [/^#\/jobs\/([^/]+)$/, (m) => jobView(decodeURIComponent(m[1])), "jobs"],
  [/^#\/jobs$/, () => jobsView(), "jobs"],
  [/^#\/webhooks$/, () => webhooksView(), "webhooks"],
  [/^#\/subjects\/([^/]+)$/, (m) => subjectView(decodeURIComponent(m[1])), "subjects"],
  [/^#\/subjects$/, () => subjectsView(), "subjects"],
];

async function route() {
  const mine = ++generation;
  if (!auth.get()) return loginView();
  nav.hidden = false;
  signOut.hidden = false;
  const hash = window.location.hash || "#/sessions";
  const found = routes.find(([pattern]) => pattern.test(hash)) || routes[1];
  for (const link of nav.querySelectorAll("a")) {
    link.classList.toggle("active", link.getAttribute("data-nav") === found[2]);
  }
  const host = h("section", { class: "page" }, h("p", { class: "muted" }, "Loading…"));
  put(view, host);
  try {
    const content = await found[1](hash.match(found[0]));
    if (mine === generation) put(host, content);
  } catch (error) {
    if (mine !== generation) return;
    if (error instanceof ApiError && error.status === 401) {
      auth.clear();
      return loginView("The API key is no longer accepted (401): sign in again.");
    }
    clear(host);
    flash(host, error);
  }
}

signOut.addEventListener("click", () => {
  auth.clear();
  window.location.hash = "";
  loginView();
});
window.addEventListener("hashchange", route);
route();
