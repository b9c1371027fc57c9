// The public HTTP API, with the API key of this tab (sessionStorage: gone when the tab closes; never sent elsewhere).
const KEY = "lethe.apiKey";

export const auth = {
  get: () => sessionStorage.getItem(KEY),
  set: (key) => sessionStorage.setItem(KEY, key),
  clear: () => sessionStorage.removeItem(KEY),
};

export class ApiError extends Error {
  constructor(status, problem) {
    super(`${problem.title || "Error"} (${status})${problem.detail ? `: ${problem.detail}` : ""}`);
    this.status = status;
    this.problem = problem;
  }
}

export async function api(path, { method = "GET", body, params } = {}) {
  const url = new URL(path, window.location.origin);
  for (const [name, value] of Object.entries(params || {})) {
    if (value !== undefined && value !== null && value !== "") url.searchParams.set(name, String(value));
  }
  const headers = { Accept: "application/json", Authorization: `Bearer ${auth.get() || ""}` };
  const init = { method, headers, cache: "no-store", credentials: "omit" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(url, init);
  const data = response.status === 204 ? null : await response.json().catch(() => null);
  if (!response.ok) throw new ApiError(response.status, data || { title: response.statusText });
  return data;
}

export const seg = (value) => encodeURIComponent(value);
