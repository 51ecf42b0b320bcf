// The agenthost operator console: one more client of the public HTTP API and event stream.
//
// Plain ES module, no dependencies, no build step. Every piece of text from the server goes into
// the page through `textContent` (see `h`), never as HTML.
//
// Layout of this file:
//   1. DOM and formatting helpers
//   2. The API: token, requests, errors
//   3. The event stream: an SSE parser and a reconnecting reader
//   4. The router and the views: sessions, one session (transcript, approvals, schedules,
//      actions), system (MCP servers, cluster)

// ---------------------------------------------------------------------------------------------
// 1. DOM and formatting helpers
// ---------------------------------------------------------------------------------------------

/**
 * Creates an element. `attrs`: `class`, `text` (textContent), `dataset` (an object), `on<event>`
 * (a listener), anything else as an attribute (`true` → present, `null`/`false` → absent).
 * Children are nodes or strings (strings become text nodes, so they are never parsed as HTML).
 */
function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value == null || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "text") el.textContent = value;
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key.startsWith("on") && typeof value === "function") {
      el.addEventListener(key.slice(2), value);
    } else el.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child == null || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

/** Sets `el`'s text only when it differs, so a refresh does not disturb what did not change. */
function setText(el, text) {
  text = String(text);
  if (el.textContent !== text) el.textContent = text;
}

const $ = (selector, root = document) => root.querySelector(selector);

const sleep = (ms, signal) =>
  new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => {
      clearTimeout(timer);
      resolve();
    });
  });

const clockFormat = new Intl.DateTimeFormat(undefined, {
  hour: "2-digit",
  minute: "2-digit",
  second: "2-digit",
});
const dateFormat = new Intl.DateTimeFormat(undefined, {
  year: "numeric",
  month: "short",
  day: "numeric",
  hour: "2-digit",
  minute: "2-digit",
});

/** A readable time: the clock time today, the date and time otherwise. */
function formatTime(ms) {
  const date = new Date(ms);
  return date.toDateString() === new Date().toDateString()
    ? clockFormat.format(date)
    : dateFormat.format(date);
}

/** "just now", "5 s ago", "in 3 min", … */
function relative(ms) {
  const diff = ms - Date.now();
  const abs = Math.abs(diff);
  if (abs < 3000) return "just now";
  const units = [
    [86_400_000, "d"],
    [3_600_000, "h"],
    [60_000, "min"],
    [1000, "s"],
  ];
  const [size, unit] = units.find(([size]) => abs >= size);
  const n = Math.floor(abs / size);
  return diff < 0 ? `${n} ${unit} ago` : `in ${n} ${unit}`;
}

/** A `<time>` element showing a readable time, optionally with its distance from now. */
function timeEl(ms, { withRelative = false } = {}) {
  const iso = new Date(ms).toISOString();
  const text = withRelative ? `${formatTime(ms)} (${relative(ms)})` : formatTime(ms);
  return h("time", { datetime: iso, title: iso }, text);
}

function formatDuration(ms) {
  if (ms < 1000) return `${ms} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(1)} s`;
  return `${Math.floor(ms / 60_000)} min ${Math.round((ms % 60_000) / 1000)} s`;
}

function formatBytes(n) {
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KiB`;
  return `${(n / 1024 / 1024).toFixed(1)} MiB`;
}

/** Tool input or other JSON for display: pretty JSON, or the raw string as it is. */
function formatJson(value) {
  if (typeof value === "string") return value;
  try {
    return JSON.stringify(value, null, 2);
  } catch {
    return String(value);
  }
}

/** Partition numbers as compact ranges: [0,1,2,5] → "0–2, 5". */
function formatRanges(numbers) {
  const sorted = [...numbers].sort((a, b) => a - b);
  const out = [];
  for (let i = 0; i < sorted.length; ) {
    let j = i;
    while (j + 1 < sorted.length && sorted[j + 1] === sorted[j] + 1) j++;
    out.push(i === j ? `${sorted[i]}` : `${sorted[i]}–${sorted[j]}`);
    i = j + 1;
  }
  return out.join(", ") || "none";
}

/** A status word as text and as `data-status` (the colour comes from CSS, the meaning from the word). */
function statusBadge(status, text = status) {
  return h("span", { class: "badge", dataset: { status } }, text);
}

// ---------------------------------------------------------------------------------------------
// 2. The API
// ---------------------------------------------------------------------------------------------

const TOKEN_KEY = "agenthost.token";

function getToken() {
  try {
    return sessionStorage.getItem(TOKEN_KEY) || "";
  } catch {
    return "";
  }
}

function setToken(token) {
  try {
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
    else sessionStorage.removeItem(TOKEN_KEY);
  } catch {
    // Storage disabled: the token lives as long as the page does.
  }
  $("#forget-token").hidden = !token;
}

/** Reads (one argument) or writes a harmless preference in localStorage; never the token. */
function remember(key, value) {
  try {
    if (value === undefined) return localStorage.getItem(key);
    localStorage.setItem(key, value);
  } catch {
    return null; // storage disabled: no memory, no harm
  }
}

function authHeaders() {
  const token = getToken();
  return token ? { Authorization: `Bearer ${token}` } : {};
}

/** An error answer of the API (`{"error": {"type", "message"}}`), or a failure to reach it. */
class ApiError extends Error {
  constructor(status, type, message) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.type = type;
  }
}

/** Reads an error body from a failed response. */
async function errorOf(response) {
  const body = await response.json().catch(() => null);
  const error = body?.error;
  return new ApiError(
    response.status,
    error?.type ?? "http_error",
    error?.message ?? `HTTP ${response.status} ${response.statusText}`,
  );
}

/**
 * Calls the API and returns the `data` of its answer. A 401 shows the token form (and throws,
 * like any other error). `body` is sent as JSON when given.
 */
async function api(method, path, { body, signal } = {}) {
  const headers = { Accept: "application/json", ...authHeaders() };
  const init = { method, headers, signal, cache: "no-store" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (e) {
    if (signal?.aborted) throw e;
    throw new ApiError(0, "network", `Cannot reach the server: ${e.message}`);
  }
  if (!response.ok) {
    const error = await errorOf(response);
    if (response.status === 401) requireToken(error.message);
    throw error;
  }
  const json = await response.json().catch(() => null);
  return json?.data;
}

/** Path segment, encoded. */
const seg = (s) => encodeURIComponent(s);

// The notice: one line saying what just failed (or succeeded), with role="status".
let noticeTimer = 0;

function notify(text, kind = "info") {
  const notice = $("#notice");
  clearTimeout(noticeTimer);
  notice.hidden = false;
  notice.dataset.kind = kind;
  notice.replaceChildren(
    h("span", { class: "notice-text" }, kind === "error" ? `Error: ${text}` : text),
    h("button", { type: "button", class: "link-button", onclick: clearNotice }, "Dismiss"),
  );
  if (kind !== "error") noticeTimer = setTimeout(clearNotice, 6000);
}

function clearNotice() {
  const notice = $("#notice");
  notice.hidden = true;
  notice.replaceChildren();
}

/** Shows what went wrong; aborts (navigation) and 401s (the token form shows) say nothing. */
function report(error, what) {
  if (error?.name === "AbortError") return;
  if (error instanceof ApiError && error.status === 401) return;
  const detail = error instanceof ApiError && error.status ? ` (${error.status} ${error.type})` : "";
  notify(`${what ? `${what}: ` : ""}${error.message}${detail}`, "error");
}

// The token form: shown, in place of the view, when the API answers 401.

let asking = false;

function requireToken(message) {
  if (asking) return;
  asking = true;
  stopView();
  const had = getToken();
  if (had) setToken(""); // refused: keep no bad token around
  $("#auth-message").textContent = had
    ? `The server refused the token${message ? ` (${message})` : ""}. Enter another one.`
    : "This server needs an API token.";
  $("#app").hidden = true;
  $("#auth").hidden = false;
  const input = $("#token");
  input.value = "";
  input.focus();
}

function setupTokenForm() {
  $("#token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const token = $("#token").value.trim();
    if (!token) return;
    setToken(token);
    $("#token").value = "";
    $("#auth").hidden = true;
    $("#app").hidden = false;
    asking = false;
    route();
  });
  $("#forget-token").addEventListener("click", () => {
    setToken("");
    notify("Token forgotten.");
    route();
  });
  $("#forget-token").hidden = !getToken();
}

// ---------------------------------------------------------------------------------------------
// 3. The event stream
// ---------------------------------------------------------------------------------------------

/** The longest line we buffer: a broken server cannot make the page grow without bound. */
const MAX_LINE = 16 * 1024 * 1024;

/**
 * An incremental server-sent events parser (the WHATWG rules, reduced to what we need): lines
 * end in `\n`, `\r\n` or `\r`; `:` starts a comment; `field: value` drops one space; `data`
 * lines join with `\n`; a blank line dispatches a frame that has data.
 */
class SseParser {
  buffer = "";
  event = "";
  data = [];
  id = undefined;

  /** Feeds decoded text; returns the frames it completed. */
  push(text) {
    this.buffer += text;
    // A trailing `\r` may be the first half of `\r\n`: keep it for the next piece.
    const hold = this.buffer.endsWith("\r") ? 1 : 0;
    const usable = this.buffer.slice(0, this.buffer.length - hold);
    const lines = usable.split(/\r\n|\r|\n/);
    const rest = lines.pop(); // the unfinished line
    this.buffer = rest + this.buffer.slice(this.buffer.length - hold);
    if (this.buffer.length > MAX_LINE) throw new Error("an event stream line is too long");
    const frames = [];
    for (const line of lines) {
      const frame = this.line(line);
      if (frame) frames.push(frame);
    }
    return frames;
  }

  /** The end of the stream: a trailing `\r` ends its line; an unfinished frame is dropped. */
  end() {
    const frames = this.buffer === "\r" ? this.push("\n") : [];
    this.buffer = "";
    return frames;
  }

  line(line) {
    if (line === "") return this.dispatch();
    if (line.startsWith(":")) return null;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "event") this.event = value;
    else if (field === "data") this.data.push(value);
    else if (field === "id" && !value.includes("\0")) this.id = value;
    return null;
  }

  dispatch() {
    const frame = this.data.length
      ? { event: this.event || "message", data: this.data.join("\n"), id: this.id }
      : null;
    this.event = "";
    this.data = [];
    this.id = undefined;
    return frame;
  }
}

/** No bytes at all (not even the server's keep-alive comments, every 15 s) for this long: reconnect. */
const STREAM_SILENCE_MS = 45_000;
const BACKOFF_FIRST_MS = 500;
const BACKOFF_MAX_MS = 10_000;

/**
 * Follows `/api/session/{id}/events` until `signal` aborts: reads it with `fetch` (EventSource
 * cannot send the token), hands every frame to `onFrame`, and after the stream ends or fails
 * reconnects with a bounded backoff, sending `Last-Event-ID: lastSeq()` so the server resumes
 * right after the last durable event applied. `onState` gets "connecting", "live" (the replay
 * is done: `synced`) or "reconnecting". `onFatal` gets an error that retrying cannot cure
 * (404, 400); following then stops.
 */
async function followEvents(sessionId, { signal, lastSeq, onFrame, onState, onFatal }) {
  let delay = BACKOFF_FIRST_MS;
  let first = true;
  while (!signal.aborted) {
    onState(first ? "connecting" : "reconnecting");
    first = false;
    // Aborts this one connection (silence watchdog) or everything (navigation).
    const attempt = new AbortController();
    const stop = () => attempt.abort();
    signal.addEventListener("abort", stop);
    let watchdog = setTimeout(stop, STREAM_SILENCE_MS);
    const alive = () => {
      clearTimeout(watchdog);
      watchdog = setTimeout(stop, STREAM_SILENCE_MS);
    };
    try {
      const headers = { Accept: "text/event-stream", ...authHeaders() };
      const seq = lastSeq();
      if (seq >= 0) headers["Last-Event-ID"] = String(seq);
      const response = await fetch(`/api/session/${seg(sessionId)}/events`, {
        headers,
        signal: attempt.signal,
        cache: "no-store",
      });
      if (!response.ok) {
        const error = await errorOf(response);
        if (response.status === 401) return requireToken(error.message);
        if (response.status === 404 || response.status === 400) return onFatal(error);
        throw error; // 503 (too many streams) and the like: try again later
      }
      const parser = new SseParser();
      const decoder = new TextDecoder();
      const reader = response.body.getReader();
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        alive();
        for (const frame of parser.push(decoder.decode(value, { stream: true }))) {
          if (frame.event === "synced") {
            delay = BACKOFF_FIRST_MS; // a connection that got this far resets the backoff
            onState("live");
          }
          onFrame(frame);
        }
      }
      for (const frame of parser.push(decoder.decode()).concat(parser.end())) onFrame(frame);
    } catch (error) {
      if (signal.aborted) return;
      if (error?.name !== "AbortError") console.warn("event stream:", error);
    } finally {
      clearTimeout(watchdog);
      signal.removeEventListener("abort", stop);
    }
    if (signal.aborted) return;
    onState("reconnecting");
    await sleep(delay, signal);
    delay = Math.min(delay * 2, BACKOFF_MAX_MS);
  }
}

// ---------------------------------------------------------------------------------------------
// 4. Router and views
// ---------------------------------------------------------------------------------------------

/** The view on screen: its abort controller (fetches, streams) and timers. */
let view = null;

function stopView() {
  if (!view) return;
  view.controller.abort();
  for (const timer of view.timers) clearInterval(timer);
  view = null;
}

/** A new view's lifetime: `signal` for its requests, `every` for its refresh loops. */
function startView() {
  stopView();
  const controller = new AbortController();
  view = { controller, timers: [] };
  const current = view;
  return {
    signal: controller.signal,
    every(ms, fn) {
      current.timers.push(setInterval(() => document.hidden || fn(), ms));
    },
  };
}

function route() {
  if (asking) return;
  const hash = location.hash || "#/";
  const app = $("#app");
  const session = hash.match(/^#\/session\/([^/]+)$/);
  let name = "sessions";
  if (session) {
    name = "session";
    renderSession(app, safeDecode(session[1]));
  } else if (hash === "#/system") {
    name = "system";
    renderSystem(app);
  } else {
    renderSessions(app);
  }
  for (const link of document.querySelectorAll("nav a[data-nav]")) {
    if (link.dataset.nav === name) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
}

function safeDecode(text) {
  try {
    return decodeURIComponent(text);
  } catch {
    return text; // a malformed escape: the server will say the id is invalid
  }
}

/** Puts a view's heading in place and moves focus to it, as a page load would. */
function mountView(app, title, ...content) {
  document.title = `${title} · agenthost`;
  const heading = h("h1", { tabindex: "-1" }, title);
  app.replaceChildren(heading, ...content);
  clearNotice(); // what the last view said no longer applies
  if (routedOnce) heading.focus({ preventScroll: true });
  routedOnce = true;
  return heading;
}
let routedOnce = false;

// --- Sessions ---------------------------------------------------------------------------------

const SESSIONS_PAGE = 50;

/** Paging state survives navigation to a session and back. */
const sessionsState = { cursor: null, previous: [], filter: "all" };

function renderSessions(app) {
  const life = startView();
  const filter = h(
    "select",
    { id: "status-filter" },
    ["all", "idle", "running", "waiting", "blocked"].map((value) =>
      h("option", { value, selected: value === sessionsState.filter }, value),
    ),
  );
  const body = h("tbody");
  const table = h(
    "table",
    { id: "sessions", class: "grid" },
    h("caption", { class: "visually-hidden" }, "Sessions, newest first"),
    h(
      "thead",
      {},
      h(
        "tr",
        {},
        ["Session", "Agent", "Status", "Claimed", "Pending", "Last activity"].map((label) =>
          h("th", { scope: "col" }, label),
        ),
      ),
    ),
    body,
  );
  const empty = h("p", { class: "empty", hidden: true });
  const summary = h("span", { class: "muted", "aria-live": "polite" });
  const prev = h("button", { type: "button", id: "prev-page", disabled: true }, "Previous page");
  const next = h("button", { type: "button", id: "next-page", disabled: true }, "Next page");
  const create = h("button", { type: "button", id: "new-session", class: "primary" }, "New session");

  mountView(
    app,
    "Sessions",
    h(
      "div",
      { class: "toolbar" },
      h("label", { for: "status-filter" }, "Status"),
      filter,
      create,
      summary,
      h("div", { class: "pager" }, prev, next),
    ),
    h("div", { class: "table-wrap" }, table),
    empty,
  );

  let page = null;
  let inFlight = 0; // loads started and not finished
  let latest = 0; // the newest load: an older answer (another page) is dropped

  /** Loads the current page; a timer tick skips while a load is running, a click does not. */
  async function load({ tick = false } = {}) {
    if (tick && inFlight) return;
    const mine = ++latest;
    inFlight++;
    try {
      const params = new URLSearchParams({ limit: String(SESSIONS_PAGE) });
      if (sessionsState.cursor) params.set("cursor", sessionsState.cursor);
      const answer = await api("GET", `/api/session?${params}`, { signal: life.signal });
      if (mine !== latest) return;
      page = answer;
      show();
    } catch (error) {
      if (error instanceof ApiError && error.type === "invalid_request" && sessionsState.cursor) {
        // A cursor the server no longer accepts: start again from the first page.
        Object.assign(sessionsState, { cursor: null, previous: [] });
      }
      report(error, "Loading sessions");
    } finally {
      inFlight--;
    }
  }

  function show() {
    if (!page) return;
    const wanted = sessionsState.filter;
    const sessions = page.sessions.filter((s) => wanted === "all" || s.status.type === wanted);
    syncRows(body, sessions);
    const total = page.sessions.length;
    empty.hidden = sessions.length > 0;
    setText(empty, total === 0 ? "No sessions yet." : `No ${wanted} sessions on this page.`);
    setText(
      summary,
      wanted === "all" ? `${total} on this page` : `${sessions.length} of ${total} on this page`,
    );
    prev.disabled = sessionsState.previous.length === 0;
    next.disabled = !page.cursor?.next;
  }

  filter.addEventListener("change", () => {
    sessionsState.filter = filter.value;
    show();
  });
  next.addEventListener("click", () => {
    if (!page?.cursor?.next) return;
    sessionsState.previous.push(sessionsState.cursor);
    sessionsState.cursor = page.cursor.next;
    load();
  });
  prev.addEventListener("click", () => {
    if (!sessionsState.previous.length) return;
    sessionsState.cursor = sessionsState.previous.pop();
    load();
  });
  create.addEventListener("click", async () => {
    create.disabled = true;
    try {
      const session = await api("POST", "/api/session", { body: {}, signal: life.signal });
      location.hash = `#/session/${seg(session.id)}`;
    } catch (error) {
      report(error, "Creating a session");
    } finally {
      create.disabled = false;
    }
  });

  load();
  life.every(2000, () => load({ tick: true }));
}

/**
 * Brings the table body in line with `sessions`, keyed by id: existing rows are updated in
 * place (a focused link stays focused), new ones created, gone ones removed.
 */
function syncRows(body, sessions) {
  const existing = new Map([...body.rows].map((row) => [row.dataset.sessionId, row]));
  sessions.forEach((session, index) => {
    let row = existing.get(session.id);
    existing.delete(session.id);
    if (!row) row = sessionRow(session);
    updateRow(row, session);
    if (body.rows[index] !== row) body.insertBefore(row, body.rows[index] ?? null);
  });
  for (const row of existing.values()) row.remove();
}

function sessionRow(session) {
  const link = h("a", { href: `#/session/${seg(session.id)}`, class: "mono" }, session.id);
  return h(
    "tr",
    { dataset: { sessionId: session.id } },
    h("td", {}, link, h("span", { class: "title" })),
    h("td", { class: "agent" }),
    h("td", { class: "status" }),
    h("td", { class: "claimed" }),
    h("td", { class: "pending num" }),
    h("td", { class: "updated" }),
  );
}

function updateRow(row, session) {
  const [idCell, agent, status, claimed, pending, updated] = row.cells;
  setText(idCell.querySelector(".title"), session.title ? ` ${session.title}` : "");
  setText(agent, session.agent);
  // The status as text; a halted session says so too (the reason as a tooltip).
  const key = `${session.status.type}|${session.halted ?? ""}`;
  if (status.dataset.key !== key) {
    status.dataset.key = key;
    status.replaceChildren(statusBadge(session.status.type));
    if (session.halted) {
      status.append(" ", h("span", { class: "badge", dataset: { status: "blocked" }, title: session.halted }, "halted"));
    }
  }
  row.dataset.status = session.halted ? "blocked" : session.status.type;
  setText(claimed, session.claimed ? "yes" : "no");
  setText(pending, session.pending);
  const iso = new Date(session.updated).toISOString();
  let time = updated.querySelector("time");
  if (!time) updated.append((time = h("time")));
  time.dateTime = iso;
  time.title = iso;
  setText(time, `${formatTime(session.updated)} (${relative(session.updated)})`);
}

// --- One session ------------------------------------------------------------------------------

function renderSession(app, id) {
  const life = startView();
  const path = `/api/session/${seg(id)}`;

  // Header: status (live from the stream), stream state, facts from GET /api/session/{id}.
  const status = h("span", { id: "session-status", class: "badge", dataset: { status: "unknown" } }, "…");
  const streamState = h("span", { id: "stream-state", class: "badge", dataset: { state: "connecting" } }, "connecting");
  const halted = h("p", { id: "session-halted", class: "halted", hidden: true });
  const facts = h("dl", { class: "facts" });

  // Transcript.
  const messages = h("ol", { class: "messages" });
  const pendingInputs = h("ol", { class: "pending-inputs", "aria-label": "Inputs not yet promoted" });
  const transcriptEl = h(
    "div",
    { id: "transcript", tabindex: "0", "aria-label": "Transcript", dataset: { lastSeq: "" } },
    messages,
    pendingInputs,
  );

  // Prompt form.
  const text = h("textarea", { id: "prompt-text", name: "text", rows: "3", required: true });
  const delivery = h(
    "select",
    { id: "prompt-delivery", name: "delivery" },
    h("option", { value: "steer" }, "steer"),
    h("option", { value: "queue" }, "queue"),
  );
  const send = h("button", { type: "submit", id: "send", class: "primary" }, "Send");
  const form = h(
    "form",
    { id: "prompt-form", class: "prompt-form" },
    h("label", { for: "prompt-text" }, "Prompt"),
    text,
    h(
      "div",
      { class: "row" },
      h("label", { for: "prompt-delivery" }, "Delivery"),
      delivery,
      send,
      h("span", { class: "hint" }, "Ctrl+Enter sends"),
    ),
  );

  // Actions, approvals, schedules.
  const interrupt = h("button", { type: "button", id: "interrupt" }, "Interrupt");
  const resume = h("button", { type: "button", id: "resume" }, "Resume");
  const compact = h("button", { type: "button", id: "compact" }, "Compact");
  const approvals = h("ul", { id: "approvals", class: "cards", hidden: true });
  const noApprovals = h("p", { class: "empty" }, "None waiting.");
  const decidedBy = h("input", {
    id: "decided-by",
    type: "text",
    autocomplete: "name",
    value: remember("agenthost.by") ?? "",
  });
  const schedules = h("ul", { id: "schedules", class: "cards", hidden: true });
  const noSchedules = h("p", { class: "empty" }, "None.");

  mountView(
    app,
    "Session",
    h(
      "div",
      { class: "session-head" },
      h("p", { class: "mono session-id" }, id),
      h(
        "p",
        { class: "state-line" },
        h("span", {}, "Status: "),
        status,
        h("span", {}, " Stream: "),
        streamState,
      ),
      halted,
      facts,
    ),
    h(
      "div",
      { class: "session-grid" },
      h(
        "section",
        { class: "transcript-column", "aria-labelledby": "transcript-title" },
        h("h2", { id: "transcript-title" }, "Transcript"),
        transcriptEl,
        form,
      ),
      h(
        "aside",
        { class: "side" },
        h(
          "section",
          { "aria-labelledby": "actions-title" },
          h("h2", { id: "actions-title" }, "Actions"),
          h("div", { class: "actions" }, interrupt, resume, compact),
        ),
        h(
          "section",
          { "aria-labelledby": "approvals-title" },
          h("h2", { id: "approvals-title" }, "Pending approvals"),
          h("div", { class: "field" }, h("label", { for: "decided-by" }, "Decided by (optional)"), decidedBy),
          approvals,
          noApprovals,
        ),
        h(
          "section",
          { "aria-labelledby": "schedules-title" },
          h("h2", { id: "schedules-title" }, "Schedules"),
          schedules,
          noSchedules,
        ),
      ),
    ),
  );

  const transcript = new Transcript(transcriptEl, messages, pendingInputs, id);
  let synced = false;

  // Refreshes of the side panels and facts, coalesced: many events in a row cause one request.
  const refreshers = {
    session: loadSession,
    approvals: loadApprovals,
    schedules: loadSchedules,
  };
  const queued = new Set();
  let refreshTimer = 0;
  function refresh(...what) {
    for (const name of what) queued.add(name);
    if (!synced) return; // during the replay: one refresh of everything once it is done
    clearTimeout(refreshTimer);
    refreshTimer = setTimeout(() => {
      const names = [...queued];
      queued.clear();
      for (const name of names) refreshers[name]();
    }, 100);
  }
  life.signal.addEventListener("abort", () => clearTimeout(refreshTimer));

  function setStatus(type) {
    const previous = status.dataset.status;
    status.dataset.status = type;
    setText(status, type);
    if (previous !== type) refresh("session", "approvals");
  }

  async function loadSession() {
    try {
      const session = await api("GET", path, { signal: life.signal });
      showFacts(facts, session);
      halted.hidden = !session.halted;
      halted.textContent = session.halted ? `Halted: ${session.halted}. It runs again only after Resume.` : "";
      if (status.dataset.status === "unknown") setStatus(session.status.type);
    } catch (error) {
      report(error, "Loading the session");
    }
  }

  async function loadApprovals() {
    try {
      const list = await api("GET", `${path}/approvals`, { signal: life.signal });
      syncApprovals(approvals, list, decide);
      approvals.hidden = list.length === 0;
      noApprovals.hidden = list.length > 0;
    } catch (error) {
      report(error, "Loading approvals");
    }
  }

  async function loadSchedules() {
    try {
      const list = await api("GET", `${path}/schedules`, { signal: life.signal });
      syncSchedules(schedules, list, cancelSchedule);
      schedules.hidden = list.length === 0;
      noSchedules.hidden = list.length > 0;
    } catch (error) {
      report(error, "Loading schedules");
    }
  }

  async function decide(approval, decision, reason, buttons) {
    buttons.forEach((b) => (b.disabled = true));
    const by = decidedBy.value.trim();
    remember("agenthost.by", by);
    try {
      const body = { decision, digest: approval.digest };
      if (by) body.by = by;
      if (reason) body.reason = reason;
      const result = await api(
        "POST",
        `${path}/approvals/${seg(approval.message_id)}/${seg(approval.call_id)}`,
        { body, signal: life.signal },
      );
      notify(`${approval.name}: ${result.decision}.`);
    } catch (error) {
      report(error, `Deciding on ${approval.name}`);
    } finally {
      buttons.forEach((b) => (b.disabled = false));
      loadApprovals();
    }
  }

  async function cancelSchedule(schedule, button) {
    button.disabled = true;
    try {
      const result = await api("DELETE", `${path}/schedules/${seg(schedule.id)}`, { signal: life.signal });
      notify(result.cancelled ? `Schedule ${schedule.id} cancelled.` : `Schedule ${schedule.id} was already gone.`);
    } catch (error) {
      report(error, "Cancelling the schedule");
    } finally {
      button.disabled = false;
      loadSchedules();
    }
  }

  // Actions: each says what happened, or the API's error, in the notice.
  async function act(button, what, fn) {
    button.disabled = true;
    button.setAttribute("aria-busy", "true");
    try {
      notify(await fn());
    } catch (error) {
      report(error, what);
    } finally {
      button.disabled = false;
      button.removeAttribute("aria-busy");
    }
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    if (!text.value.trim()) return;
    act(send, "Sending the prompt", async () => {
      const receipt = await api("POST", `${path}/prompt`, {
        body: { text: text.value, delivery: delivery.value },
        signal: life.signal,
      });
      text.value = "";
      return `Prompt admitted (${receipt.delivery}, seq ${receipt.admitted_seq}).`;
    });
  });
  text.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
      event.preventDefault();
      form.requestSubmit();
    }
  });
  interrupt.addEventListener("click", () =>
    act(interrupt, "Interrupt", async () => {
      const result = await api("POST", `${path}/interrupt`, { signal: life.signal });
      return result.interrupted ? "Interrupted." : "Nothing was running.";
    }),
  );
  resume.addEventListener("click", () =>
    act(resume, "Resume", async () => {
      await api("POST", `${path}/resume`, { signal: life.signal });
      refresh("session");
      return "Resume accepted.";
    }),
  );
  compact.addEventListener("click", () =>
    act(compact, "Compact", async () => {
      notify("Compacting…");
      const outcome = await api("POST", `${path}/compact`, { signal: life.signal });
      return outcome.outcome === "compacted"
        ? `Compacted: history before seq ${outcome.kept_from} is summarized.`
        : `Compaction: ${outcome.outcome}.`;
    }),
  );

  // The event stream drives the transcript and the status.
  function onFrame(frame) {
    switch (frame.event) {
      case "synced":
        synced = true;
        transcript.live = true;
        refresh("session", "approvals", "schedules");
        return;
      case "status": {
        const data = parseJson(frame.data);
        if (data?.type) setStatus(data.type);
        return;
      }
      case "delta": {
        const data = parseJson(frame.data);
        if (data) transcript.delta(data);
        return;
      }
      case "error": {
        const data = parseJson(frame.data);
        notify(`The event stream failed: ${data?.message ?? frame.data}`, "error");
        return;
      }
      default: {
        const event = parseJson(frame.data);
        if (typeof event?.seq !== "number" || typeof event.type !== "string") return;
        if (!transcript.apply(event)) return;
        // Events that change what the side panels show.
        if (event.type.startsWith("approval_")) refresh("approvals");
        if (event.type.startsWith("schedule_")) refresh("schedules");
        if (/^(prompt_|execution_|session_)/.test(event.type)) refresh("session");
      }
    }
  }

  followEvents(id, {
    signal: life.signal,
    lastSeq: () => transcript.lastSeq,
    onFrame,
    onState(state) {
      if (state !== "live") transcript.gap();
      streamState.dataset.state = state;
      setText(streamState, state);
    },
    onFatal(error) {
      streamState.dataset.state = "stopped";
      setText(streamState, "stopped");
      report(error, "The event stream");
    },
  });
  loadSession();
}

function parseJson(text) {
  try {
    return JSON.parse(text);
  } catch {
    console.warn("not JSON:", text);
    return null;
  }
}

function showFacts(dl, session) {
  const usage = session.usage;
  const rows = [
    ["Agent", session.agent],
    ["Model", session.model ?? "agent default"],
    ["Title", session.title],
    ["Created", timeEl(session.created)],
    ["Last activity", timeEl(session.updated, { withRelative: true })],
    ["Claimed", session.claimed ? "yes" : "no"],
    ["Pending input", String(session.pending)],
    ["Tokens", `${usage.input + usage.cache_read + usage.cache_write} in, ${usage.output} out`],
    ["Cost", usage.cost_nanos ? `$${(usage.cost_nanos / 1e9).toFixed(4)}` : null],
    ["Recoveries", session.resume_attempts ? String(session.resume_attempts) : null],
  ];
  dl.replaceChildren(
    ...rows
      .filter(([, value]) => value != null && value !== "")
      .map(([term, value]) => h("div", {}, h("dt", {}, term), h("dd", {}, value))),
  );
}

/** The pending approvals, keyed by `message_id/call_id` (a reason being typed survives a refresh). */
function syncApprovals(list, approvals, decide) {
  const existing = new Map([...list.children].map((li) => [li.dataset.approval, li]));
  for (const approval of approvals) {
    const key = `${approval.message_id}/${approval.call_id}`;
    if (existing.has(key)) {
      existing.delete(key);
      continue;
    }
    const reason = h("input", { type: "text", class: "deny-reason", maxlength: "4096" });
    const approve = h("button", { type: "button", class: "approve primary" }, "Approve");
    const deny = h("button", { type: "button", class: "deny danger" }, "Deny");
    const buttons = [approve, deny];
    approve.addEventListener("click", () => decide(approval, "approve", null, buttons));
    deny.addEventListener("click", () => decide(approval, "deny", reason.value.trim() || null, buttons));
    list.append(
      h(
        "li",
        { dataset: { approval: key } },
        h("p", { class: "card-title" }, h("span", { class: "mono" }, approval.name)),
        h("pre", { class: "code", tabindex: "0", "aria-label": `Input of ${approval.name}` }, formatJson(approval.input)),
        h("p", { class: "muted small" }, "Expires ", timeEl(approval.expires_at, { withRelative: true }), " · call ", h("span", { class: "mono" }, approval.call_id)),
        h("label", { class: "field" }, h("span", {}, "Reason for a denial (optional)"), reason),
        h("div", { class: "actions" }, approve, deny),
      ),
    );
  }
  for (const li of existing.values()) li.remove();
}

function syncSchedules(list, schedules, cancel) {
  list.replaceChildren(
    ...schedules.map((schedule) => {
      const button = h("button", { type: "button", class: "cancel-schedule" }, "Cancel");
      button.addEventListener("click", () => cancel(schedule, button));
      const repeat = schedule.cron
        ? `cron ${schedule.cron}${schedule.tz ? ` (${schedule.tz})` : " (UTC)"}`
        : "once";
      return h(
        "li",
        { dataset: { scheduleId: schedule.id } },
        h("p", { class: "card-title" }, schedule.text),
        h(
          "p",
          { class: "muted small" },
          "Next: ",
          timeEl(schedule.next, { withRelative: true }),
          ` · ${repeat} · ${schedule.delivery} · `,
          h("span", { class: "mono" }, schedule.id),
        ),
        h("div", { class: "actions" }, button),
      );
    }),
  );
}

// --- The transcript ---------------------------------------------------------------------------

/**
 * The transcript, built from durable events applied exactly once each, in seq order, plus the
 * live deltas of the parts being streamed. Everything is keyed by message id and call id.
 */
class Transcript {
  constructor(root, messagesEl, pendingEl, sessionId) {
    this.root = root;
    this.messagesEl = messagesEl;
    this.pendingEl = pendingEl;
    this.sessionId = sessionId;
    /** Seq of the last durable event applied (-1: none). */
    this.lastSeq = -1;
    /** message id → { el, body, foot, open: {text, reasoning, summary, tool_input: Map} } */
    this.messages = new Map();
    /** `message_id/call_id` → the call's parts */
    this.calls = new Map();
    /** Whether the replay is done (`synced`): deltas then come from a part's start. */
    this.live = false;
    // Follow the end of the transcript while the reader is there; stop when they scroll up.
    this.stick = true;
    this.scrollQueued = false;
    root.addEventListener("scroll", () => {
      this.stick = root.scrollHeight - root.scrollTop - root.clientHeight < 48;
    });
  }

  /** Applies one durable event; `false` if it was applied already (seq not above the last). */
  apply(event) {
    if (event.seq <= this.lastSeq) return false;
    this.lastSeq = event.seq;
    this.root.dataset.lastSeq = String(event.seq);
    const handler = HANDLERS[event.type];
    if (handler) {
      this.keepScrolled(() => {
        try {
          handler.call(this, event);
        } catch (error) {
          console.error("applying", event, error);
        }
      });
    }
    return true;
  }

  /** Appends streamed text to the open part it belongs to (its `*_ended` event replaces it). */
  delta(delta) {
    const message = this.messages.get(delta.message_id);
    if (!message) return;
    this.keepScrolled(() => {
      if (delta.kind === "tool_input") {
        let el = message.open.toolInput.get(delta.part);
        if (!el) {
          el = h("pre", { class: "part streaming tool-input", "aria-label": "Tool input, streaming" });
          message.open.toolInput.set(delta.part, el);
          message.body.append(el);
        }
        el.append(delta.delta);
        return;
      }
      const kind = delta.kind === "summary" ? "summary" : delta.kind;
      let el = message.open[kind];
      if (!el) {
        el = streamingPart(kind);
        // The first delta after a reconnect continues text whose start was lost: say so.
        if (message.gap) el.querySelector(".part-text").append("… ");
        message.gap = false;
        message.open[kind] = el;
        message.body.append(el);
      }
      el.querySelector(".part-text").append(delta.delta);
    });
  }

  /**
   * The stream broke: deltas sent while it was down are lost, so open streamed parts are
   * dropped; their `*_ended` events will bring the whole text.
   */
  gap() {
    this.live = false;
    for (const message of this.messages.values()) {
      if (this.dropOpen(message)) message.gap = true;
    }
  }

  /** Removes a message's streamed parts not yet ended; whether there were any. */
  dropOpen(message) {
    let any = false;
    for (const kind of ["text", "reasoning", "summary"]) {
      if (message.open[kind]) {
        message.open[kind].remove();
        message.open[kind] = null;
        any = true;
      }
    }
    for (const el of message.open.toolInput.values()) el.remove();
    any ||= message.open.toolInput.size > 0;
    message.open.toolInput.clear();
    return any;
  }

  /**
   * Runs `fn`, then keeps the transcript scrolled to the end if the reader was there (once per
   * frame: a replay of many events does not measure the layout for each).
   */
  keepScrolled(fn) {
    fn();
    if (!this.stick || this.scrollQueued) return;
    this.scrollQueued = true;
    requestAnimationFrame(() => {
      this.scrollQueued = false;
      if (this.stick) this.root.scrollTop = this.root.scrollHeight;
    });
  }

  /** A message element, created on first use. */
  message(id, role, head, where = this.messagesEl) {
    let message = this.messages.get(id);
    if (message) return message;
    const body = h("div", { class: "msg-body" });
    const foot = h("div", { class: "msg-foot" });
    const el = h(
      "li",
      { class: "message", dataset: { messageId: id, role } },
      h("div", { class: "msg-head" }, ...head),
      body,
      foot,
    );
    where.append(el);
    // Made during a replay, its part may have been streaming before we connected: its
    // first delta then continues text we never saw.
    const gap = !this.live;
    message = { el, body, foot, open: { text: null, reasoning: null, summary: null, toolInput: new Map() }, gap };
    this.messages.set(id, message);
    return message;
  }

  /** A line in the transcript that is not a message: a failure, an interrupt, a schedule. */
  note(event, ...content) {
    this.messagesEl.append(
      h("li", { class: "note", dataset: { event: event.type, seq: event.seq } }, timeEl(event.time), " ", ...content),
    );
  }

  call(event) {
    return this.calls.get(`${event.id}/${event.call_id}`);
  }

  /** Sets a call's state: `data-state` and the word shown. */
  setCallState(call, state) {
    call.el.dataset.state = state;
    call.state.dataset.status = state;
    setText(call.state, state);
  }

  endCall(call, event) {
    // A call that waited for an approval and never started did not run: no duration.
    if (call.asked && !call.ran) return;
    const took = Math.max(0, event.time - call.started);
    setText(call.duration, formatDuration(took));
    call.duration.title = `from ${new Date(call.started).toISOString()} to ${new Date(event.time).toISOString()}`;
  }
}

function roleHead(label, time, ...extra) {
  return [h("span", { class: "role" }, label), ...extra, timeEl(time)];
}

function streamingPart(kind) {
  const labels = { text: null, reasoning: "Reasoning (streaming)", summary: "Summary (streaming)" };
  const el = h("div", { class: `part ${kind} streaming`, dataset: { streaming: "true" } }, h("div", { class: "part-text" }));
  if (labels[kind]) el.prepend(h("p", { class: "part-label" }, labels[kind]));
  return el;
}

/** A durable text or reasoning part: the open streamed one becomes it, or a new one is added. */
function endPart(transcript, event, kind) {
  const message = transcript.messages.get(event.id);
  if (!message) return;
  let el = message.open[kind];
  message.open[kind] = null;
  message.gap = false; // the next part streams from its start
  const textEl = h("div", { class: "part-text" }, event.text);
  const part =
    kind === "reasoning"
      ? h("details", { class: "part reasoning" }, h("summary", {}, "Reasoning"), textEl)
      : h("div", { class: "part text" }, textEl);
  if (event.incomplete) part.append(h("p", { class: "part-label warn" }, "incomplete: the stream was cut"));
  if (el) el.replaceWith(part);
  else message.body.append(part);
}

/** What each durable event does to the transcript (`this` is the Transcript). */
const HANDLERS = {
  session_created(e) {
    this.note(e, `Session created (agent ${e.agent}${e.title ? `, “${e.title}”` : ""}).`);
  },

  prompt_admitted(e) {
    // Waits, marked pending, below the transcript until it is promoted.
    const message = this.message(
      e.id,
      "user",
      roleHead("User", e.time, h("span", { class: "badge", dataset: { status: e.delivery } }, e.delivery), h("span", { class: "badge pending-label", dataset: { status: "pending" } }, "pending")),
      this.pendingEl,
    );
    message.el.dataset.pending = "true";
    message.body.append(h("div", { class: "part text" }, h("div", { class: "part-text" }, e.text)));
    for (const file of e.files ?? []) {
      message.body.append(h("p", { class: "file" }, "Attached: ", file.filename ?? file.url, ` (${file.mime})`));
    }
  },

  prompt_promoted(e) {
    const message = this.messages.get(e.id);
    if (!message) return;
    delete message.el.dataset.pending;
    message.el.querySelector(".pending-label")?.remove();
    this.messagesEl.append(message.el);
  },

  instructions_updated(e) {
    const sources = (e.changed ?? []).map((c) => c.source).join(", ");
    const message = this.message(e.id, "system", roleHead("System", e.time, sources ? h("span", { class: "muted" }, sources) : null));
    message.body.append(h("div", { class: "part text" }, h("div", { class: "part-text" }, e.text)));
  },

  execution_failed(e) {
    this.note(e, h("strong", {}, "Execution failed"), `: ${e.error}.`, e.halted ? " The session is halted until resumed." : "");
  },

  execution_interrupted(e) {
    this.note(e, h("strong", {}, "Interrupted"), e.reason === "shutdown" ? " by a server shutdown." : " by the user.");
  },

  execution_started(e) {
    if (e.forced) this.note(e, "Resumed by request.");
  },

  recovery_attempted(e) {
    this.note(e, `Recovery attempt ${e.attempt} after a restart.`);
  },

  step_started(e) {
    this.message(e.id, "assistant", roleHead("Assistant", e.time, h("span", { class: "muted" }, `step ${e.step} · ${e.agent} · ${e.model}`)));
  },

  text_ended(e) {
    endPart(this, e, "text");
  },

  reasoning_ended(e) {
    endPart(this, e, "reasoning");
  },

  tool_called(e) {
    const message = this.messages.get(e.id);
    if (!message) return;
    // The call replaces the oldest streamed tool input of this message.
    const [first] = message.open.toolInput.keys();
    if (first !== undefined) {
      message.open.toolInput.get(first).remove();
      message.open.toolInput.delete(first);
    }
    const state = h("span", { class: "badge call-state" });
    const duration = h("span", { class: "duration muted" });
    const detail = h("div", { class: "call-detail" });
    const output = h("div", { class: "call-output" });
    const el = h(
      "div",
      { class: "part call", dataset: { callId: e.call_id } },
      h("div", { class: "call-head" }, h("span", { class: "call-name mono" }, e.name), state, duration),
      h("details", { class: "call-input" }, h("summary", {}, "Input"), h("pre", { class: "code", tabindex: "0" }, formatJson(e.input))),
      detail,
      output,
    );
    message.body.append(el);
    const call = { el, state, duration, detail, output, started: e.time, messageId: e.id, callId: e.call_id, name: e.name };
    this.calls.set(`${e.id}/${e.call_id}`, call);
    this.setCallState(call, "running");
  },

  approval_requested(e) {
    const call = this.call(e);
    if (!call) return;
    call.asked = true;
    this.setCallState(call, "waiting");
    call.detail.replaceChildren(h("p", { class: "approval-note" }, "Waits for approval; expires ", timeEl(e.expires_at, { withRelative: true }), "."));
  },

  approval_decided(e) {
    const call = this.call(e);
    if (!call) return;
    const who = e.by ? ` by ${e.by}` : "";
    call.detail.replaceChildren(
      h("p", { class: "approval-note" }, h("span", { class: "badge", dataset: { status: e.decision } }, e.decision), `${who}${e.reason ? `: ${e.reason}` : ""}`),
    );
  },

  tool_started(e) {
    const call = this.call(e);
    if (!call) return;
    call.started = e.time; // the duration counts from here, not from the wait for approval
    call.ran = true;
    this.setCallState(call, "running");
  },

  tool_succeeded(e) {
    const call = this.call(e);
    if (!call) return;
    this.setCallState(call, "completed");
    this.endCall(call, e);
    showOutput(this, call, e.output, e.truncated, false);
  },

  tool_failed(e) {
    const call = this.call(e);
    if (!call) return;
    this.setCallState(call, "error");
    this.endCall(call, e);
    showOutput(this, call, e.error, false, true);
  },

  tool_output(e) {
    const call = this.call(e);
    if (!call) return;
    call.bytes = e.bytes;
    call.el.dataset.bytes = String(e.bytes);
    const button = call.output.querySelector("button.load-output");
    if (button) button.textContent = `Load whole output (${formatBytes(e.bytes)})`;
  },

  step_ended(e) {
    const message = this.messages.get(e.id);
    if (!message) return;
    this.dropOpen(message);
    message.el.dataset.finish = e.finish;
    const u = e.usage;
    message.foot.append(h("p", { class: "muted small" }, `finish: ${e.finish} · ${u.input + u.cache_read + u.cache_write} in, ${u.output} out`));
  },

  step_failed(e) {
    const message = this.messages.get(e.id);
    if (!message) return;
    this.dropOpen(message);
    message.el.dataset.error = e.error.kind;
    message.foot.append(h("p", { class: "error-line" }, h("strong", {}, `Step failed (${e.error.kind})`), `: ${e.error.message}`));
  },

  retry_scheduled(e) {
    const message = this.messages.get(e.id);
    if (!message) return;
    this.dropOpen(message); // the retry streams the message again from its start
    message.foot.append(
      h("p", { class: "warn small" }, `Retry ${e.attempt} in ${formatDuration(e.delay_ms)} after ${e.error.kind}: ${e.error.message}`),
    );
  },

  compaction_started(e) {
    const message = this.message(e.id, "compaction", roleHead("Compaction", e.time, h("span", { class: "muted" }, e.auto ? "automatic" : "requested")));
    message.el.dataset.state = "running";
  },

  compaction_ended(e) {
    const message = this.messages.get(e.id);
    if (!message) return;
    message.el.dataset.state = "completed";
    const summary = h("details", { class: "part summary", open: true }, h("summary", {}, `Summary (history before seq ${e.kept_from})`), h("div", { class: "part-text" }, e.summary));
    if (message.open.summary) message.open.summary.replaceWith(summary);
    else message.body.append(summary);
    message.open.summary = null;
  },

  compaction_failed(e) {
    const message = this.messages.get(e.id);
    if (!message) return;
    this.dropOpen(message);
    message.el.dataset.state = "failed";
    message.foot.append(h("p", { class: "error-line" }, h("strong", {}, "Compaction failed"), `: ${e.error}`));
  },

  schedule_set(e) {
    const s = e.schedule;
    this.note(e, `Schedule ${s.id} set: “${s.text}”, next `, timeEl(s.next), s.cron ? ` (cron ${s.cron})` : "", ".");
  },

  schedule_fired(e) {
    this.note(e, `Schedule ${e.id} fired`, e.admitted ? "" : " (missed, nothing admitted)", e.next ? [", next ", timeEl(e.next)] : "", ".");
  },

  schedule_cancelled(e) {
    this.note(e, `Schedule ${e.id} cancelled.`);
  },
};

/** Shows a call's output (or error); a cut preview gets a button that loads the whole. */
function showOutput(transcript, call, text, truncated, failed) {
  const pre = h("pre", { class: `code ${failed ? "error-output" : ""}`, tabindex: "0", "aria-label": `${failed ? "Error" : "Output"} of ${call.name}` }, text);
  call.output.replaceChildren(h("p", { class: "part-label" }, failed ? "Error" : "Output"), pre);
  if (!truncated) return;
  const label = call.bytes ? `Load whole output (${formatBytes(call.bytes)})` : "Load whole output";
  const button = h("button", { type: "button", class: "load-output link-button" }, label);
  button.addEventListener("click", async () => {
    button.disabled = true;
    try {
      const whole = await api(
        "GET",
        `/api/session/${seg(transcript.sessionId)}/tool-output/${seg(call.messageId)}/${seg(call.callId)}`,
      );
      pre.textContent = whole.output;
      note.replaceChildren(`The whole output (${formatBytes(whole.bytes)}).`);
    } catch (error) {
      button.disabled = false;
      report(error, "Loading the whole output");
    }
  });
  const note = h("p", { class: "muted small" }, "The output was cut: this is its head and tail. ", button);
  call.output.append(note);
}

// --- System -----------------------------------------------------------------------------------

function renderSystem(app) {
  const life = startView();
  const mcpBody = h("tbody");
  const clusterBody = h("tbody");
  const clusterInfo = h("p", { class: "muted" });
  const mcpEmpty = h("p", { class: "empty", hidden: true }, "No MCP servers are configured.");

  const table = (id, caption, headers, body) =>
    h(
      "div",
      { class: "table-wrap" },
      h(
        "table",
        { id, class: "grid" },
        h("caption", { class: "visually-hidden" }, caption),
        h("thead", {}, h("tr", {}, headers.map((label) => h("th", { scope: "col" }, label)))),
        body,
      ),
    );

  mountView(
    app,
    "System",
    h(
      "section",
      { "aria-labelledby": "mcp-title" },
      h("h2", { id: "mcp-title" }, "MCP servers"),
      table("mcp", "MCP servers", ["Name", "Transport", "Status", "Tools", "Restarts", "Last error"], mcpBody),
      mcpEmpty,
    ),
    h(
      "section",
      { "aria-labelledby": "cluster-title" },
      h("h2", { id: "cluster-title" }, "Cluster"),
      clusterInfo,
      table("cluster", "Cluster nodes", ["Node", "URL", "Alive", "Partitions"], clusterBody),
    ),
  );

  async function loadMcp() {
    try {
      const servers = await api("GET", "/api/mcp", { signal: life.signal });
      mcpEmpty.hidden = servers.length > 0;
      mcpBody.replaceChildren(
        ...servers.map((server) =>
          h(
            "tr",
            { dataset: { mcp: server.name } },
            h("td", { class: "mono" }, server.name, server.trusted ? h("span", { class: "muted" }, " (trusted)") : null),
            h("td", {}, server.transport),
            h("td", {}, statusBadge(server.status)),
            h(
              "td",
              { class: "num" },
              server.tools.length
                ? h("details", {}, h("summary", {}, String(server.tools.length)), h("ul", { class: "plain" }, server.tools.map((t) => h("li", { class: "mono", title: t.description }, t.name))))
                : "0",
            ),
            h("td", { class: "num" }, String(server.restarts)),
            h(
              "td",
              { class: "last-error" },
              server.last_error ?? "—",
              server.stderr?.length
                ? h("details", {}, h("summary", {}, `stderr (${server.stderr.length} lines)`), h("pre", { class: "code", tabindex: "0" }, server.stderr.join("\n")))
                : null,
            ),
          ),
        ),
      );
    } catch (error) {
      report(error, "Loading MCP servers");
    }
  }

  async function loadCluster() {
    try {
      const cluster = await api("GET", "/api/cluster", { signal: life.signal });
      clusterInfo.textContent = `Store: ${cluster.store} · ${cluster.partitions} partition${cluster.partitions === 1 ? "" : "s"} · answered by ${cluster.node}`;
      clusterBody.replaceChildren(
        ...cluster.nodes.map((node) =>
          h(
            "tr",
            { dataset: { node: node.id } },
            h("td", { class: "mono" }, node.id, node.id === cluster.node ? h("span", { class: "muted" }, " (this node)") : null),
            h("td", { class: "mono" }, node.url || "—"),
            h("td", {}, statusBadge(node.alive ? "alive" : "down", node.alive ? "yes" : "no")),
            h("td", {}, `${formatRanges(node.partitions)} (${node.partitions.length} held)`),
          ),
        ),
      );
    } catch (error) {
      report(error, "Loading the cluster");
    }
  }

  // Only refresh tables whose details the user has not opened (an open list would close).
  const refresh = () => {
    if (!mcpBody.querySelector("details[open]")) loadMcp();
    loadCluster();
  };
  loadMcp();
  loadCluster();
  life.every(5000, refresh);
}

// ---------------------------------------------------------------------------------------------
// Start
// ---------------------------------------------------------------------------------------------

setupTokenForm();
window.addEventListener("hashchange", route);
route();
