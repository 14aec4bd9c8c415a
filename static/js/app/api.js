// Talking to the server, for every page: fetch helpers that turn a failed answer into words (the
// `detail` of FastAPI's errors), and where a tab keeps a run's write token. No DOM at import:
// tests/js/api.test.mjs runs it under Node.

/** FastAPI's error `detail` in words: a string as it is; validation errors ([{loc, msg}],
 *  server/app.py) as "field: why; ..." (loc without its 'body' / 'query' / 'path' head; an
 *  error of the whole body is named `whole`, or is its message alone). Nothing: null.
 *  `labels` ({api name: label}, a form's): the words that form shows instead (humanDetail). */
export function detailText(detail, whole = null, labels = null) {
  if (detail === undefined || detail === null || detail === '') return null;
  if (typeof detail === 'string') return labels ? labelled(detail, labels) : detail;
  if (!Array.isArray(detail)) return JSON.stringify(detail);
  return detail.map((d) => {
    const loc = (d.loc ?? []).slice(1);
    if (labels) return humanDetail(loc, d.msg, labels, whole);
    const where = loc.join('.') || whole;
    return where ? `${where}: ${d.msg}` : d.msg;
  }).join('; ');
}

/** An API name in a message: snake_case (n_embd, warmup_steps), which no prose word is. */
const API_NAME = /\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b/g;

/** `text` with each API name that `labels` has replaced by its label. */
const labelled = (text, labels) => text.replace(API_NAME, (n) => labels[n] ?? n);

/** One validation error as a form's user reads it: the field by its label, pydantic's
 *  "Value error, " (a validator's own message follows it) dropped, API names in the message
 *  labelled, and "Input should be ..." said of the field ("Learning rate should be ..."). */
function humanDetail(loc, msg, labels, whole) {
  const where = loc.map((p) => labels[p] ?? p).join('.') || whole;
  const why = labelled(String(msg ?? '').replace(/^Value error, /, ''), labels);
  if (!where) return why;
  return why.startsWith('Input should ') ? `${where} ${why.slice('Input '.length)}` : `${where}: ${why}`;
}

/** Why `res` failed, from its body: the JSON `detail` in words, else the body's text, else the
 *  status ("404 Not Found"). Reads the body. `whole`, `labels`: see detailText. */
export async function responseDetail(res, whole = null, labels = null) {
  const text = await res.text().catch(() => '');
  let detail = null;
  try {
    detail = detailText(JSON.parse(text).detail, whole, labels);
  } catch {
    detail = text.trim() || null;
  }
  return detail ?? `${res.status}${res.statusText ? ` ${res.statusText}` : ''}`;
}

/** A request the server refused: `status` and its detail as the message. */
export class HttpError extends Error {
  constructor(status, message) {
    super(message);
    this.name = 'HttpError';
    this.status = status;
  }
}

/** fetch() -> the JSON body; a refusal throws an HttpError with the server's detail (`whole`:
 *  see detailText). */
export async function fetchJson(url, init, whole = null) {
  const res = await fetch(url, init);
  if (!res.ok) throw new HttpError(res.status, await responseDetail(res, whole));
  return res.json();
}

/** A JSON request body: fetch() options for `method` with `body` as JSON. */
export function jsonBody(method, body) {
  return { method, headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) };
}

/** How long to wait before retrying `res` (null: a network error): the server's Retry-After in
 *  seconds when it says one (a 503 for a batch whose training losses are in flight, or for a
 *  run whose waiting places are taken), at most 30 s; else the backoff. */
export function retryDelayMs(res, backoffMs) {
  const after = Number(res?.headers?.get('retry-after'));
  return res?.headers?.has('retry-after') && Number.isFinite(after) && after >= 0
    ? Math.min(after * 1000, 30000) : backoffMs;
}

/** fetch() that rides out a server restart or an outage: network errors and 5xx are retried,
 *  by default until the server answers (a run waits for its next batch rather than failing
 *  for a cause that passes), with backoff at most MAX_BACKOFF_MS apart or after the
 *  Retry-After the server asks for; `attempts` bounds the tries. 4xx is final and reported
 *  ("url: status detail"). `onRetry(why)` hears each failed try ("unreachable: Failed to
 *  fetch", "503 ..."), and onRetry(null) the answer that follows one. `accept`: 4xx statuses
 *  returned as answers rather than thrown. `sleep` is for tests. */
export async function fetchRetrying(url, init = {}, { attempts = Infinity, onRetry = () => {},
  accept = [], sleep = (ms) => new Promise((r) => setTimeout(r, ms)) } = {}) {
  let wait = 250;
  for (let i = 1; ; i++) {
    let res = null;
    let why;
    try {
      res = await fetch(url, init);
    } catch (e) {
      why = `unreachable: ${e.message}`;
    }
    if (res?.ok || accept.includes(res?.status)) {
      if (i > 1) onRetry(null);
      return res;
    }
    if (res && res.status < 500) throw new Error(`${url}: ${res.status} ${await responseDetail(res)}`);
    if (why === undefined) {
      const detail = await responseDetail(res);
      why = detail.startsWith(String(res.status)) ? detail : `${res.status} ${detail}`;
    }
    if (i >= attempts) throw new Error(`${url}: ${why}`);
    onRetry(why);
    await sleep(retryDelayMs(res, wait));
    wait = Math.min(wait * 2, MAX_BACKOFF_MS);
  }
}
export const MAX_BACKOFF_MS = 8000;

// ---- the run's write token ------------------------------------------------------------------
// The tab that creates (or resumes, or branches) a run keeps its token in sessionStorage, never
// in a URL; the run page trains the run when it finds it. The key's prefix is the server's
// (server/web/auth.py TOKEN_STORAGE_PREFIX, written on every page by templates/base.html), so the
// browser drivers (server/cli/chromium.py, the e2e tests) hand a token over the same way.

/** sessionStorage key of `runId`'s token. */
export function tokenKey(runId) {
  const prefix = document.documentElement.dataset.runTokenKey;
  if (!prefix) throw new Error('this page has no data-run-token-key (templates/base.html)');
  return `${prefix}${runId}`;
}

export function saveToken(runId, token) {
  sessionStorage.setItem(tokenKey(runId), JSON.stringify({ token }));
}

/** The token this tab keeps for `runId` to train it, or null (none, or the run was trained
 *  here already: retireToken). */
export function savedToken(runId) {
  const held = JSON.parse(sessionStorage.getItem(tokenKey(runId)) || 'null');
  return held && !held.trained ? held.token : null;
}

export function forgetToken(runId) {
  sessionStorage.removeItem(tokenKey(runId));
}

/** After this tab trained the run: a reload must not train it again, but the token still
 *  authorizes renaming, deleting, resuming and branching it (heldToken). */
export function retireToken(runId) {
  const token = heldToken(runId);
  if (token !== null) sessionStorage.setItem(tokenKey(runId), JSON.stringify({ token, trained: true }));
}

/** The token this tab holds for `runId` (to train it or not), or null. */
export function heldToken(runId) {
  return JSON.parse(sessionStorage.getItem(tokenKey(runId)) || 'null')?.token ?? null;
}

/** fetch() options `init` with `Authorization: Bearer` of the token this tab holds for
 *  `runId`, if any: a server other machines reach asks for it to change the run
 *  (server/web/deps.py authorize); without one the request goes as it is, and a refusal says
 *  why. */
export function withToken(runId, init = {}) {
  const token = heldToken(runId);
  if (token === null) return init;
  return { ...init, headers: { ...(init.headers ?? {}), authorization: `Bearer ${token}` } };
}

/** A room run's join token (server/room/): kept apart from the run's write token, which a
 *  participant never holds. The room's page takes it from its join link (#join=...). */
export function takeJoinToken(runId, loc = location, hist = history) {
  const key = `${tokenKey(runId)}:join`;
  const token = new URLSearchParams(loc.hash.slice(1)).get('join');
  if (token) {
    sessionStorage.setItem(key, token);
    hist.replaceState(hist.state, '', loc.pathname + loc.search);
  }
  return sessionStorage.getItem(key);
}

/** The room worker this tab was (its token), so a reload joins as that worker again; null. */
export function heldWorkerToken(runId) {
  return sessionStorage.getItem(`${tokenKey(runId)}:worker`);
}

/** The id of the room worker this tab was (the page offers to rejoin as it), or null. */
export function heldWorkerId(runId) {
  const id = sessionStorage.getItem(`${tokenKey(runId)}:worker-id`);
  return id === null ? null : Number(id);
}

export function saveWorkerToken(runId, token, worker = null) {
  sessionStorage.setItem(`${tokenKey(runId)}:worker`, token);
  if (worker !== null) sessionStorage.setItem(`${tokenKey(runId)}:worker-id`, String(worker));
}

/** The link that takes `runId` with its token to another browser: the token rides in the
 *  fragment, which no request sends to a server (takeLinkToken reads it there). */
export function resumeLink(origin, runId, token) {
  return `${origin}/runs/${encodeURIComponent(runId)}#token=${encodeURIComponent(token)}`;
}

/** A page opened from a resume link (`#token=...`): the token kept as the start page keeps
 *  it, and the fragment taken out of the address bar and history. True if there was one. */
export function takeLinkToken(runId, loc = location, hist = history) {
  const token = new URLSearchParams(loc.hash.slice(1)).get('token');
  if (!token) return false;
  saveToken(runId, token);
  hist.replaceState(hist.state, '', loc.pathname + loc.search);
  return true;
}
