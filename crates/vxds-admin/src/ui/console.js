// The vxds console: a dependency-free script over the admin API (see src/ui.rs for the
// token scheme). Views are `#` routes; every text from the server goes into the page as text
// nodes, never as HTML.
"use strict";

const TOKEN_KEY = "vxds.token";
const $ = (id) => document.getElementById(id);

const state = {
  head: 0,            // newest revision seen
  lastEventId: null,  // for resuming the event stream
  stream: null,       // AbortController of the event stream
  refreshTimer: null,
  view: null,
  notice: null,       // a message for the next render of the revisions page
  clientPages: [0],   // the `after` of each clients page up to the one shown
};

// Clients per page of `GET /v1/clients`.
const CLIENTS_PAGE = 100;

// ---- DOM ----------------------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(node.dataset, value);
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function show(...nodes) {
  const view = $("view");
  view.replaceChildren(...nodes);
}

// ---- API ----------------------------------------------------------------------------------

function token() { return sessionStorage.getItem(TOKEN_KEY) || ""; }

function authHeaders(extra) {
  const headers = Object.assign({ Accept: "application/json" }, extra || {});
  if (token()) headers.Authorization = "Bearer " + token();
  return headers;
}

class ApiError extends Error {
  constructor(status, problem) {
    super(problemText(status, problem));
    this.status = status;
    this.problem = problem;
  }
}

function problemText(status, problem) {
  if (!problem) return "HTTP " + status;
  const lines = [problem.detail || problem.title || "HTTP " + status];
  for (const item of problem.errors || []) {
    lines.push("• " + (item.pointer ? item.pointer + ": " : "") + item.message);
  }
  return lines.join("\n");
}

async function api(method, path, body) {
  const init = { method, headers: authHeaders() };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  const text = await response.text();
  let json = null;
  try { json = text ? JSON.parse(text) : null; } catch (_) { json = null; }
  if (response.status === 401) {
    signOut("The server refused the token: " + problemText(401, json));
    throw new ApiError(401, json);
  }
  if (!response.ok) throw new ApiError(response.status, json);
  return json;
}

const enc = encodeURIComponent;
const resourcePath = (type, name) => "/v1/resources/" + enc(type) + "/" + enc(name);
const typeLabel = (r) => r.type || r.type_url.split("/").pop();

// ---- sign in ------------------------------------------------------------------------------

function signOut(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  if (state.stream) state.stream.abort();
  state.stream = null;
  $("nav").hidden = true;
  $("sign-out").hidden = true;
  $("view").hidden = true;
  $("events").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = message || "";
  setLive(false);
}

async function start() {
  // A server without tokens (loopback development) answers without one.
  try {
    const response = await fetch("/v1/revisions?limit=1", { headers: authHeaders() });
    if (response.status === 401) {
      signOut(token() ? "The server refused the token." : "");
      return;
    }
  } catch (e) {
    signOut("The server does not answer: " + e.message);
    return;
  }
  $("login").hidden = true;
  $("nav").hidden = false;
  $("sign-out").hidden = !token();
  $("view").hidden = false;
  $("events").hidden = false;
  if (!state.stream) followEvents();
  route();
}

$("login-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const value = $("token").value.trim();
  if (!value) { $("login-error").textContent = "Paste a token first."; return; }
  sessionStorage.setItem(TOKEN_KEY, value);
  $("token").value = "";
  start();
});
$("sign-out").addEventListener("click", () => signOut("Signed out."));

// ---- routing ------------------------------------------------------------------------------

function route() {
  if ($("view").hidden) return;
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  const view = parts[0] || "resources";
  state.view = view;
  for (const link of document.querySelectorAll("#nav a")) {
    link.classList.toggle("active", link.dataset.view === view || (view === "resource" && link.dataset.view === "resources"));
  }
  const render = {
    resources: () => renderResources(),
    resource: () => renderResource(parts[1], parts.slice(2).join("/")),
    clients: () => renderClients(),
    revisions: () => renderRevisions(),
  }[view] || (() => show(el("p", { class: "error" }, "There is no view " + view)));
  render().catch((e) => show(el("h1", {}, "Error"), el("p", { class: "error" }, e.message)));
}
window.addEventListener("hashchange", route);

// Re-renders the current view soon after something changed (coalescing bursts of events).
function refreshSoon(views) {
  if (!views.includes(state.view)) return;
  clearTimeout(state.refreshTimer);
  state.refreshTimer = setTimeout(() => {
    // Not while the operator is typing or confirming something.
    if (document.activeElement && document.activeElement.matches("input, textarea, select")) return;
    if (document.querySelector(".confirm")) return;
    route();
  }, 300);
}

// ---- resources ----------------------------------------------------------------------------

const listing = { type: "", search: "" };

async function renderResources() {
  const resources = [];
  let cursor = "";
  do {
    const query = "limit=1000" + (listing.type ? "&type=" + enc(listing.type) : "") + (cursor ? "&cursor=" + enc(cursor) : "");
    const page = await api("GET", "/v1/resources?" + query);
    resources.push(...page.resources);
    cursor = page.next_cursor || "";
  } while (cursor && resources.length < 20000);
  const types = ["", "listener", "route", "cluster", "endpoint", "secret", "runtime", "virtual_host", "scoped_route", "extension_config"];
  const select = el("select", { id: "type-filter", "aria-label": "type" },
    types.map((t) => el("option", { value: t, selected: t === listing.type }, t || "all types")));
  const search = el("input", { id: "search", type: "search", placeholder: "search names", value: listing.search, "aria-label": "search" });
  const tbody = el("tbody");
  const fill = () => {
    const needle = listing.search.toLowerCase();
    const rows = resources
      .filter((r) => !needle || r.name.toLowerCase().includes(needle))
      .map((r) => el("tr", { class: "resource-row", dataset: { name: r.name, type: typeLabel(r) } },
        el("td", {}, typeLabel(r)),
        el("td", {}, el("a", { href: "#/resource/" + enc(typeLabel(r)) + "/" + enc(r.name) }, r.name)),
        el("td", {}, r.variant_count),
        el("td", {}, r.revision),
        el("td", { class: "muted" }, r.updated_at)));
    tbody.replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { colspan: 5, class: "muted" }, "No resources match."))]));
  };
  search.addEventListener("input", () => { listing.search = search.value; fill(); });
  select.addEventListener("change", () => { listing.type = select.value; route(); });
  fill();
  show(el("h1", {}, "Resources"),
    el("div", { class: "toolbar" }, search, select),
    el("table", { id: "resource-table" },
      el("thead", {}, el("tr", {}, ["Type", "Name", "Variants", "Revision", "Updated"].map((h) => el("th", {}, h)))),
      tbody));
}

// ---- one resource -------------------------------------------------------------------------

function valueLabel(v) {
  if (v.kind === "value") return JSON.stringify(v.value);
  return v.kind; // "other" or "absent"
}

function variantLabel(i) { return "V" + (i + 1); }

async function renderResource(type, name) {
  const [resource, coverage] = await Promise.all([
    api("GET", resourcePath(type, name)),
    api("GET", resourcePath(type, name) + "/coverage").catch((e) => ({ error: e.message })),
  ]);
  const cards = resource.variants.map((v, i) => el("div", { class: "variant v" + (i % 8), id: "variant-" + i, dataset: { id: v.id } },
    el("div", {}, el("strong", {}, variantLabel(i)), " ", el("span", { class: "constraints mono" }, v.constraints_text)),
    el("div", { class: "muted mono" }, "version " + v.version + (v.ttl ? " · ttl " + v.ttl : "")),
    el("pre", { class: "body" }, JSON.stringify(v.resource, null, 2))));

  const keys = coverage.keys || [];
  const inputs = keys.map((k) => el("input", { class: "try-param", dataset: { key: k.key }, placeholder: "absent", "aria-label": k.key }));
  const extra = el("textarea", { id: "try-extra", rows: 2, placeholder: "more parameters, one key=value per line" });
  const result = el("div", { id: "try-result" });
  const resolve = async () => {
    const params = {};
    for (const input of inputs) if (input.value !== "") params[input.dataset.key] = input.value;
    for (const line of extra.value.split("\n")) {
      const at = line.indexOf("=");
      if (at > 0) params[line.slice(0, at).trim()] = line.slice(at + 1).trim();
    }
    document.querySelectorAll(".variant.chosen").forEach((n) => n.classList.remove("chosen"));
    try {
      const answer = await api("POST", "/v1/resolve", { type, name, params });
      const index = answer.variant ? resource.variants.findIndex((v) => v.id === answer.variant.id) : -1;
      if (index >= 0) $("variant-" + index).classList.add("chosen");
      result.replaceChildren(
        el("p", {}, index >= 0
          ? el("span", { class: "ok", id: "try-variant" }, variantLabel(index) + ": " + answer.variant.constraints_text)
          : el("span", { class: "error", id: "try-variant" }, "no variant: the client sees the resource as absent")),
        el("p", { class: "muted", id: "try-reason" }, answer.reason));
    } catch (e) {
      result.replaceChildren(el("p", { class: "error" }, e.message));
    }
  };
  const tryBox = el("form", { class: "try", id: "try", onsubmit: (e) => { e.preventDefault(); resolve(); } },
    keys.length ? inputs.map((input) => el("label", {}, input.dataset.key + " ", input)) : el("p", { class: "muted" }, "The variants constrain no key."),
    el("div", {}, extra),
    el("button", { id: "try-button", class: "primary", type: "submit" }, "Resolve"),
    result);

  show(el("h1", {}, typeLabel(resource) + " ", el("span", { class: "mono", id: "resource-name" }, resource.name)),
    el("p", { class: "muted" }, resource.variants.length + " variant(s) · version " + resource.version + " · revision " + resource.revision),
    el("h2", {}, "Variants"), el("div", { class: "variants", id: "variants" }, cards),
    el("h2", {}, "Coverage"), coverageGrid(coverage, inputs),
    el("h2", {}, "Try parameters"), tryBox);
}

// The grid: rows are the combinations of every key but the last, columns the last key's values.
function coverageGrid(coverage, inputs) {
  if (coverage.error) return el("p", { class: "error", id: "coverage" }, coverage.error);
  const keys = coverage.keys;
  const pick = (cell, td) => {
    document.querySelectorAll("td.cell.picked").forEach((n) => n.classList.remove("picked"));
    td.classList.add("picked");
    for (const input of inputs) input.value = cell.example[input.dataset.key] ?? "";
  };
  const cellNode = (cell) => {
    const td = el("td", {
      class: "cell " + (cell.variant === null ? "uncovered" : "c" + (cell.variant % 8)),
      dataset: { variant: cell.variant === null ? "none" : String(cell.variant) },
      title: cell.variant === null ? "no variant" : coverage.variants[cell.variant].constraints_text,
    }, cell.variant === null ? "none" : variantLabel(cell.variant));
    td.addEventListener("click", () => pick(cell, td));
    return td;
  };
  let table;
  if (keys.length === 0) {
    table = el("table", { id: "coverage-grid" }, el("tbody", {}, el("tr", {}, el("th", {}, "every client"), cellNode(coverage.cells[0]))));
  } else {
    const last = keys[keys.length - 1];
    const width = last.values.length;
    const rowKeys = keys.slice(0, -1);
    const head = el("tr", {},
      el("th", {}, rowKeys.map((k) => k.key).join(", ") + (rowKeys.length ? " \\ " : "") + last.key),
      last.values.map((v) => el("th", { class: "mono" }, valueLabel(v))));
    const rows = [];
    for (let start = 0; start < coverage.cells.length; start += width) {
      const first = coverage.cells[start];
      const label = rowKeys.map((k, i) => k.key + " " + valueLabel(k.values[first.classes[i]])).join(", ");
      rows.push(el("tr", {}, el("th", { class: "mono" }, label || "—"),
        coverage.cells.slice(start, start + width).map(cellNode)));
    }
    table = el("table", { id: "coverage-grid" }, el("thead", {}, head), el("tbody", {}, rows));
  }
  const legend = el("p", { class: "legend" },
    coverage.variants.map((v, i) => el("span", {}, el("strong", {}, variantLabel(i)), " ", el("span", { class: "mono" }, v.constraints_text))),
    el("span", { id: "uncovered-count", class: coverage.uncovered ? "error" : "ok" },
      coverage.uncovered ? coverage.uncovered + " of " + coverage.cells.length + " cells uncovered" : "every cell covered"));
  return el("div", { id: "coverage" },
    el("p", { class: "muted" }, "Each cell is every client with those values (\"other\": any value no variant mentions; \"absent\": the key not sent). Click a cell to try it."),
    el("div", { class: "grid-wrap" }, table), legend);
}

// ---- clients ------------------------------------------------------------------------------

async function renderClients() {
  const after = state.clientPages[state.clientPages.length - 1];
  const { clients, next_after } = await api("GET", "/v1/clients?limit=" + CLIENTS_PAGE + "&after=" + after);
  const page = state.clientPages.length;
  const rows = clients.map((c) => el("tr", { class: "client", dataset: { node: c.node_id, stream: c.stream_id } },
    el("td", {}, el("div", { class: "mono" }, c.node_id || "(no node id)"),
      el("div", { class: "muted" }, [c.node_cluster, c.user_agent].filter(Boolean).join(" · ")),
      el("div", { class: "muted" }, "stream " + c.stream_id + " · " + c.service + " " + c.protocol + " · since " + c.connected_at),
      c.identity ? el("div", { class: "muted mono" }, "identity " + c.identity) : null),
    el("td", {}, c.types.map((t) => el("div", { class: "client-type" },
      el("div", { class: "mono" }, el("strong", {}, t.type_url.split(".").pop())),
      el("div", { class: "mono params" }, Object.keys(t.params).length
        ? Object.entries(t.params).map(([k, v]) => k + "=" + v + (t.param_sources[k] === "identity" ? " (trusted)" : "")).join(", ")
        : el("span", { class: "muted" }, "no parameters")),
      el("div", { class: "mono subscriptions" }, t.subscriptions.length ? t.subscriptions.join(", ") : "(wildcard)"),
      el("div", { class: "muted" },
        "sent " + (t.last_sent ? t.last_sent.version : "—") + " · acked " + (t.last_acked ? t.last_acked.version : "—")),
      t.last_nacked ? el("div", { class: "nack" + (isInError(t) ? "" : " past") },
        "NACK of " + t.last_nacked.version + " at " + t.last_nacked.at + ": " + t.last_nacked.message) : null)))));
  const pager = el("p", { id: "clients-pager" },
    page > 1 ? el("button", { id: "clients-first", type: "button", onclick: () => { state.clientPages = [0]; renderClients(); } }, "First page") : null,
    " ",
    next_after !== null && next_after !== undefined
      ? el("button", { id: "clients-next", type: "button", onclick: () => { state.clientPages.push(next_after); renderClients(); } }, "Next page")
      : null);
  show(el("h1", {}, "Connected clients"),
    el("p", { class: "muted" }, (page > 1 || next_after ? "page " + page + ": " : "") + clients.length + " stream(s)"),
    pager,
    el("table", { id: "clients-table" },
      el("thead", {}, el("tr", {}, el("th", {}, "Client"), el("th", {}, "Per type: parameters, subscriptions, versions, refusals"))),
      el("tbody", {}, rows.length ? rows : el("tr", {}, el("td", { colspan: 2, class: "muted" }, "No client is connected.")))));
}

function isInError(t) {
  return !t.last_acked || Number(t.last_nacked.nonce) > Number(t.last_acked.nonce);
}

// ---- revisions ----------------------------------------------------------------------------

async function renderRevisions() {
  // Revisions are gap-free: the newest 200 are those after head - 200 (the head comes with
  // the event stream's hello; before it, every page is read).
  const all = [];
  let after = Math.max(0, state.head - 200);
  for (;;) {
    const page = await api("GET", "/v1/revisions?limit=1000&after=" + after);
    all.push(...page.revisions);
    if (page.next_after === null || page.next_after === undefined) break;
    after = page.next_after;
  }
  const newest = all.slice(-200).reverse();
  if (newest.length) state.head = Math.max(state.head, newest[0].revision);
  // A restore is guarded by the head the operator saw, not the live one.
  state.shownHead = newest.length ? newest[0].revision : state.head;
  // The last restore's outcome stays until the next one; open diffs stay open across redraws.
  const notice = state.notice || { kind: "", text: "" };
  show(el("h1", {}, "Revisions"),
    el("p", { id: "restore-result", class: notice.kind }, notice.text),
    el("div", { id: "revisions" }, newest.map(revisionNode)));
  // The rollout of the newest few (each one request); `rollout` events refresh them.
  newest.slice(0, ROLLOUTS_SHOWN).forEach((r) => loadRollout(r.revision));
}

const ROLLOUTS_SHOWN = 20;
const rolloutTimers = new Map();

// A revision's rollout: a progress bar (accepted of the streams it changed) and the NACK texts.
async function loadRollout(revision) {
  const box = $("rollout-" + revision);
  if (!box) return;
  let r;
  try {
    r = await api("GET", "/v1/revisions/" + revision + "/rollout");
  } catch (e) {
    box.replaceChildren(el("span", { class: "muted" }, "rollout: " + e.message));
    return;
  }
  const parts = [r.acked + "/" + r.streams + " streams accepted"];
  if (r.nacked) parts.push(r.nacked + " refused");
  if (r.pending) parts.push(r.pending + " pending");
  if (r.gone) parts.push(r.gone + " left");
  if (r.ack_time && r.ack_time.p50_ms !== null && r.ack_time.p50_ms !== undefined) {
    parts.push("ACK p50 " + r.ack_time.p50_ms + " ms, p99 " + r.ack_time.p99_ms + " ms, max " + r.ack_time.max_ms + " ms");
  }
  box.className = "rollout " + r.state;
  box.replaceChildren(
    el("progress", { max: Math.max(r.streams, 1), value: r.streams ? r.acked : 1, title: r.state }),
    el("span", {}, r.state + " · " + parts.join(" · ")),
    r.nacks.length
      ? el("ul", { class: "nacks" }, r.nacks.map((n) =>
        el("li", { class: "nack" }, n.node + " (" + n.type_url.split(".").pop() + ", " + n.replica + "): " + n.error)))
      : null);
}

// A `rollout` event: that revision's box is read again, at most every 300 ms.
function rolloutMoved(revision) {
  if (rolloutTimers.has(revision)) return;
  rolloutTimers.set(revision, setTimeout(() => { rolloutTimers.delete(revision); loadRollout(revision); }, 300));
}

const openDiffs = new Set();

function revisionNode(r) {
  const details = el("div", { class: "details" });
  const node = el("div", { class: "revision", id: "revision-" + r.revision, dataset: { revision: r.revision } },
    el("header", {},
      el("strong", {}, "#" + r.revision),
      el("span", {}, r.message || el("span", { class: "muted" }, "(no message)")),
      el("span", { class: "muted" }, (r.author || "anonymous") + " · " + r.created_at),
      el("span", { class: "actions" },
        el("button", { class: "show-diff", type: "button", onclick: () => toggleDiff(r.revision, details) }, "Diff"),
        el("button", { class: "restore", type: "button", onclick: () => confirmRestore(r.revision, node) }, "Restore…"))),
    el("div", { class: "muted mono changes" }, r.changes.map((c) => c.change + " " + (c.type || c.type_url) + " " + c.name).join(" · "),
      r.change_count > r.changes.length
        ? el("button", { class: "all-changes", type: "button", onclick: (e) => allChanges(r.revision, e.target.parentNode) },
          "and " + (r.change_count - r.changes.length) + " more")
        : null),
    el("div", { class: "rollout", id: "rollout-" + r.revision }),
    details);
  if (openDiffs.has(r.revision)) loadDiff(r.revision, details);
  return node;
}

// Every change of a revision, read a page at a time.
async function allChanges(revision, node) {
  const all = [];
  let after = 0;
  for (;;) {
    const page = await api("GET", "/v1/revisions/" + revision + "/changes?after=" + after);
    all.push(...page.changes);
    if (page.next_after === null || page.next_after === undefined) break;
    after = page.next_after;
  }
  node.replaceChildren(all.map((c) => c.change + " " + (c.type || c.type_url) + " " + c.name).join(" · "));
}

async function toggleDiff(revision, details) {
  if (details.childElementCount) { details.replaceChildren(); openDiffs.delete(revision); return; }
  openDiffs.add(revision);
  await loadDiff(revision, details);
}

async function loadDiff(revision, details) {
  try {
    const detail = await api("GET", "/v1/revisions/" + revision + "?bodies=true&limit=100");
    const more = detail.next_after === null || detail.next_after === undefined ? null
      : el("p", { class: "muted" }, "The first " + detail.resources.length + " of " + detail.change_count + " changed resources.");
    details.replaceChildren(...(more ? [more] : []), ...detail.resources.map((res) => el("div", { class: "resource-diff" },
      el("h2", {}, (res.type || res.type_url) + " " + res.name + " ", el("span", { class: "badge " + res.change }, res.change)),
      res.history_kept ? null : el("p", { class: "muted" }, "This revision is older than the variant history: no per-variant diff."),
      res.variants.map((v) => el("div", { class: "variant-diff" },
        el("div", {}, el("span", { class: "mono constraints" }, v.constraints_text), " ", el("span", { class: "badge " + v.change }, v.change),
          el("span", { class: "muted mono" }, "  " + (v.before ? v.before.version : "—") + " → " + (v.after ? v.after.version : "—"))),
        v.change === "unchanged" ? null : diffNode(v.before && v.before.resource, v.after && v.after.resource))))));
  } catch (e) {
    details.replaceChildren(el("p", { class: "error" }, e.message));
  }
}

// A unified line diff of two JSON bodies (longest common subsequence; bodies are small).
function diffNode(before, after) {
  const a = before ? JSON.stringify(before, null, 2).split("\n") : [];
  const b = after ? JSON.stringify(after, null, 2).split("\n") : [];
  if (a.length * b.length > 4e6) {
    return el("div", {}, el("pre", {}, a.join("\n")), el("pre", {}, b.join("\n")));
  }
  const lcs = Array.from({ length: a.length + 1 }, () => new Uint32Array(b.length + 1));
  for (let i = a.length - 1; i >= 0; i--) {
    for (let j = b.length - 1; j >= 0; j--) {
      lcs[i][j] = a[i] === b[j] ? lcs[i + 1][j + 1] + 1 : Math.max(lcs[i + 1][j], lcs[i][j + 1]);
    }
  }
  const lines = [];
  let i = 0, j = 0;
  while (i < a.length || j < b.length) {
    if (i < a.length && j < b.length && a[i] === b[j]) { lines.push(["ctx", "  " + a[i]]); i++; j++; }
    else if (j < b.length && (i === a.length || lcs[i][j + 1] >= lcs[i + 1][j])) { lines.push(["add", "+ " + b[j]]); j++; }
    else { lines.push(["del", "- " + a[i]]); i++; }
  }
  return el("pre", { class: "diff" }, lines.map(([kind, text]) => el("span", { class: kind }, text)));
}

function confirmRestore(revision, node) {
  document.querySelectorAll(".confirm").forEach((n) => n.remove());
  const seen = state.shownHead;
  const box = el("div", { class: "confirm", id: "confirm-restore" },
    el("p", {}, "Restore the store to its state right after revision " + revision + "? This commits a new revision, validated like any change; clients get the old configuration."),
    el("button", { id: "confirm-restore-yes", class: "danger", type: "button", onclick: () => restore(revision, box, seen) }, "Restore revision " + revision),
    " ",
    el("button", { id: "confirm-restore-no", type: "button", onclick: () => box.remove() }, "Cancel"));
  node.append(box);
}

async function restore(revision, box, seen) {
  const result = $("restore-result");
  try {
    const answer = await api("POST", "/v1/revisions/" + revision + "/restore",
      { expected_revision: seen, message: "via the web console" });
    box.remove();
    // Shown by the re-rendered list, which has the new revision.
    state.notice = { kind: "ok", text: "Revision " + answer.revision + ": " + (answer.summary || "restored revision " + revision) };
    route();
  } catch (e) {
    box.remove();
    state.notice = { kind: "error", text: "Restore refused: " + e.message +
      (e.status === 409 ? " (the store moved on since this page was drawn: look at the new revisions, then try again)" : "") };
    result.className = state.notice.kind;
    result.textContent = state.notice.text;
  }
}

// ---- the event stream ---------------------------------------------------------------------

function setLive(on) {
  const live = $("live");
  live.className = "live " + (on ? "on" : "off");
  live.textContent = on ? "live" : "offline";
}

function logEvent(text, kind) {
  const log = $("event-log");
  log.prepend(el("li", { class: kind || "" }, new Date().toLocaleTimeString() + " " + text));
  while (log.childElementCount > 100) log.lastElementChild.remove();
}

function onEvent(name, data) {
  let body = {};
  try { body = data ? JSON.parse(data) : {}; } catch (_) { body = {}; }
  switch (name) {
    case "hello":
      state.head = Math.max(state.head, body.revision);
      logEvent("connected at revision " + body.revision + (body.clients ? "" : " (no xDS server in this process)"));
      break;
    case "revision":
      state.head = Math.max(state.head, body.revision);
      logEvent("revision " + body.revision + " by " + (body.author || "anonymous") + ": " + (body.message || "") +
        " — " + body.changed.map((c) => (c.type || c.type_url) + " " + c.name).join(", ") +
        (body.change_count > body.changed.length ? " and " + (body.change_count - body.changed.length) + " more" : ""), "revision");
      refreshSoon(["resources", "resource", "revisions"]);
      break;
    case "client_connected":
      logEvent("client " + (body.node_id || "#" + body.stream_id) + " connected (" + body.service + " " + body.protocol + ")");
      refreshSoon(["clients"]);
      break;
    case "client_disconnected":
      logEvent("client " + (body.node_id || "#" + body.stream_id) + " left");
      refreshSoon(["clients"]);
      break;
    case "ack":
      logEvent("ACK " + (body.node_id || "#" + body.stream_id) + " " + body.type_url.split(".").pop() + " " + body.version, "ack");
      refreshSoon(["clients"]);
      break;
    case "nack":
      logEvent("NACK " + (body.node_id || "#" + body.stream_id) + " " + body.type_url.split(".").pop() + ": " + body.message, "nack");
      refreshSoon(["clients"]);
      break;
    case "rollout":
      if (body.nacked) logEvent("revision " + body.revision + ": " + body.nacked + " stream(s) refused it", "nack");
      rolloutMoved(body.revision);
      break;
    case "lagged":
      logEvent(body.missed + " client events missed (the console fell behind)");
      refreshSoon(["clients"]);
      break;
    case "reset":
      if (body.reason === "slow_reader") {
        // The stream ends; it resumes from this revision and the pages are read afresh.
        logEvent("the console fell behind the event stream; catching up");
        refreshSoon(["resources", "resource", "revisions", "clients"]);
        break;
      }
      state.head = body.revision;
      logEvent("the store's head went back to revision " + body.revision);
      refreshSoon(["resources", "resource", "revisions"]);
      break;
  }
}

// `EventSource` cannot send `Authorization`; fetch can, and its body is read as a stream.
async function followEvents() {
  const controller = new AbortController();
  state.stream = controller;
  let delay = 500;
  while (state.stream === controller) {
    try {
      const headers = authHeaders({ Accept: "text/event-stream" });
      if (state.lastEventId !== null) headers["Last-Event-ID"] = state.lastEventId;
      const response = await fetch("/v1/events", { headers, signal: controller.signal });
      if (response.status === 401) { signOut("The server refused the token."); return; }
      if (!response.ok) throw new Error("HTTP " + response.status);
      setLive(true);
      delay = 500;
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value.replace(/\r\n?/g, "\n");
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          let name = "message", data = [], id = null;
          for (const line of block.split("\n")) {
            if (line === "" || line.startsWith(":")) continue; // keep-alive comments
            const colon = line.indexOf(":");
            const field = colon < 0 ? line : line.slice(0, colon);
            const text = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
            if (field === "event") name = text;
            else if (field === "data") data.push(text);
            else if (field === "id") id = text;
          }
          if (id !== null) state.lastEventId = id;
          onEvent(name, data.join("\n"));
        }
      }
    } catch (e) {
      if (controller.signal.aborted) return;
    }
    setLive(false);
    await new Promise((resolve) => setTimeout(resolve, delay));
    delay = Math.min(delay * 2, 10000);
  }
}

start();
