// Talking to the server, for every page: fetch helpers that turn a failed answer into words (the
// `detail` of FastAPI's errors), and where a tab keeps a run's write token. No DOM at import:
// tests/js/api.test.mjs runs it under Node.

/** FastAPI's error `detail` in words: a string as it is; validation errors ([{loc, msg}],
 *  server/app.py) as "field: why; ..." (loc without its 'body' / 'query' / 'path' head; an
 *  error of the whole body is named `whole`, or is its message alone). Nothing: null. */
export function detailText(detail, whole = null) {
  if (detail === undefined || detail === null || detail === '') return null;
  if (typeof detail === 'string') return detail;
  if (!Array.isArray(detail)) return JSON.stringify(detail);
  return detail.map((d) => {
    const where = (d.loc ?? []).slice(1).join('.') || whole;
    return where ? `${where}: ${d.msg}` : d.msg;
  }).join('; ');
}

/** Why `res` failed, from its body: the JSON `detail` in words, else the body's text, else the
 *  status ("404 Not Found"). Reads the body. */
export async function responseDetail(res, whole = null) {
  const text = await res.text().catch(() => '');
  let detail = null;
  try {
    detail = detailText(JSON.parse(text).detail, whole);
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

/** fetch() that rides out a server restart: network errors and 5xx are retried with backoff
 *  (about a minute in all); 4xx is final and reported ("url: status detail"). */
export async function fetchRetrying(url, init = {}, attempts = 12) {
  let wait = 250;
  for (let i = 1; ; i++) {
    let res = null;
    try {
      res = await fetch(url, init);
    } catch (e) {
      if (i >= attempts) throw new Error(`${url}: ${e.message}`);
    }
    if (res?.ok) return res;
    if (res && res.status < 500) throw new Error(`${url}: ${res.status} ${await responseDetail(res)}`);
    if (i >= attempts) throw new Error(`${url}: ${res ? res.status : 'unreachable'}`);
    await new Promise((r) => setTimeout(r, wait));
    wait = Math.min(wait * 2, 8000);
  }
}

// ---- the run's write token ------------------------------------------------------------------
// The tab that creates (or resumes, or branches) a run keeps its token in sessionStorage, never
// in a URL; the run page trains the run when it finds it. The key's prefix is the server's
// (server/auth.py TOKEN_STORAGE_PREFIX, written on every page by templates/base.html), so the
// browser drivers (server/chromium.py, the e2e tests) hand a token over the same way.

/** sessionStorage key of `runId`'s token. */
export function tokenKey(runId) {
  const prefix = document.documentElement.dataset.runTokenKey;
  if (!prefix) throw new Error('this page has no data-run-token-key (templates/base.html)');
  return `${prefix}${runId}`;
}

export function saveToken(runId, token) {
  sessionStorage.setItem(tokenKey(runId), JSON.stringify({ token }));
}

/** The token this tab keeps for `runId`, or null. */
export function savedToken(runId) {
  return JSON.parse(sessionStorage.getItem(tokenKey(runId)) || 'null')?.token ?? null;
}

export function forgetToken(runId) {
  sessionStorage.removeItem(tokenKey(runId));
}
