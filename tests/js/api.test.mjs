// The pages' fetch helpers and token storage (static/js/app/api.js): FastAPI's error `detail`
// in words, retries that stop at a 4xx, and the sessionStorage key the server names.
import assert from 'node:assert/strict';
import { afterEach, test } from 'node:test';
import {
  HttpError, MAX_BACKOFF_MS, detailText, fetchJson, fetchRetrying, forgetToken, heldToken, responseDetail,
  resumeLink, retireToken, retryDelayMs, saveToken, savedToken, takeJoinToken, takeLinkToken, tokenKey,
  withToken,
} from '../../static/js/app/api.js';

const realFetch = globalThis.fetch;
afterEach(() => {
  globalThis.fetch = realFetch;
  delete globalThis.document;
  delete globalThis.sessionStorage;
});

const json = (status, body) => new Response(JSON.stringify(body), { status,
  headers: { 'content-type': 'application/json' } });

test('detail in words: a string, validation errors by field, nothing', () => {
  assert.equal(detailText('the run is finished'), 'the run is finished');
  const errors = [{ loc: ['body', 'name'], msg: 'too long' }, { loc: ['body'], msg: 'bad shape' }];
  assert.equal(detailText(errors), 'name: too long; bad shape');
  assert.equal(detailText(errors, 'config'), 'name: too long; config: bad shape');
  assert.equal(detailText([{ loc: ['body', 'tags', 0], msg: 'empty' }]), 'tags.0: empty');
  assert.equal(detailText(undefined), null);
  assert.equal(detailText(null), null);
});

test('detail in a form\'s words: labels for API names, no pydantic prefix', () => {
  const labels = { lr: 'Learning rate', n_embd: 'Width', n_head: 'Heads', warmup_steps: 'Warmup steps' };
  const errors = [
    { loc: ['body', 'lr'], msg: 'Input should be greater than 0' },
    { loc: ['body'], msg: 'Value error, model shape: n_embd (96) must be divisible by n_head (5)' },
    { loc: ['body', 'max_norm'], msg: 'Field required' },
  ];
  assert.equal(detailText(errors, null, labels), 'Learning rate should be greater than 0; ' +
    'model shape: Width (96) must be divisible by Heads (5); max_norm: Field required');
  assert.equal(detailText([{ loc: ['body'], msg: 'Value error, warmup_steps (30) exceeds steps (20)' }],
    'config', labels), 'config: Warmup steps (30) exceeds steps (20)');
  // A plain string: only the names the labels know change (not other snake_case words).
  assert.equal(detailText('n_head (5) does not divide; see data_dir', null, labels),
    'Heads (5) does not divide; see data_dir');
  // Without labels, as the API says it (other pages, and tests above).
  assert.equal(detailText(errors.slice(0, 1)), 'lr: Input should be greater than 0');
});

test('why a response failed: its detail, else its text, else its status', async () => {
  assert.equal(await responseDetail(json(409, { detail: 'busy' })), 'busy');
  assert.equal(await responseDetail(new Response('plain words', { status: 500 })), 'plain words');
  assert.equal(await responseDetail(new Response('', { status: 404, statusText: 'Not Found' })),
    '404 Not Found');
  assert.equal(await responseDetail(json(422, {})), '422');
  assert.equal(await responseDetail(json(422, { detail: [{ loc: ['body', 'lr'], msg: 'Input should be a '
    + 'valid number' }] }), null, { lr: 'Learning rate' }), 'Learning rate should be a valid number');
});

test('fetchJson answers the body, or throws the status and the detail', async () => {
  globalThis.fetch = async (url) => (url === '/ok' ? json(200, { a: 1 })
    : json(422, { detail: [{ loc: ['body'], msg: 'no' }] }));
  assert.deepEqual(await fetchJson('/ok'), { a: 1 });
  await assert.rejects(fetchJson('/bad', undefined, 'config'),
    (e) => e instanceof HttpError && e.status === 422 && e.message === 'config: no');
});

test('fetchRetrying retries 5xx and network errors, and stops at a 4xx with its detail', async () => {
  const answers = [() => { throw new TypeError('offline'); }, () => json(503, {}), () => json(200, 'x')];
  globalThis.fetch = async () => answers.shift()();
  const heard = [];
  const sleep = async () => {};
  assert.equal((await fetchRetrying('/b', {}, { sleep, onRetry: (w) => heard.push(w) })).status, 200);
  assert.deepEqual(heard, ['unreachable: offline', '503', null]);
  globalThis.fetch = async () => json(403, { detail: 'token revoked' });
  await assert.rejects(fetchRetrying('/c'), { message: '/c: 403 token revoked' });
  globalThis.fetch = async () => json(502, { detail: 'bad gateway' });
  await assert.rejects(fetchRetrying('/d', {}, { attempts: 2, sleep }), { message: '/d: 502 bad gateway' });
});

test('by default fetchRetrying outlasts an outage of any length, its waits capped', async () => {
  // The server away for 200 tries (the old bound, 12 tries, was ~56 s: a minute's outage
  // failed the run), then back.
  let tries = 0;
  globalThis.fetch = async () => {
    if (++tries <= 200) throw new TypeError('Failed to fetch');
    return json(200, 'x');
  };
  const waits = [];
  const res = await fetchRetrying('/e', {}, { sleep: async (ms) => { waits.push(ms); } });
  assert.equal(res.status, 200);
  assert.equal(waits.length, 200);
  assert.deepEqual(waits.slice(0, 6), [250, 500, 1000, 2000, 4000, 8000]);
  assert.equal(Math.max(...waits), MAX_BACKOFF_MS);
  assert.ok(waits.reduce((a, b) => a + b) > 20 * 60 * 1000, 'more than 20 minutes of waiting');
});

test('a retry waits for the Retry-After the server asks for, else the backoff', () => {
  const busy = (after) => new Response('', { status: 503, headers: after === null ? {} : { 'retry-after': after } });
  assert.equal(retryDelayMs(busy('1'), 4000), 1000);
  assert.equal(retryDelayMs(busy('0'), 4000), 0);
  assert.equal(retryDelayMs(busy('3600'), 250), 30000);
  assert.equal(retryDelayMs(busy(null), 250), 250);
  assert.equal(retryDelayMs(busy('soon'), 500), 500);
  assert.equal(retryDelayMs(null, 2000), 2000);
});

test('the token key is the prefix the page was rendered with', () => {
  const store = new Map();
  globalThis.document = { documentElement: { dataset: { runTokenKey: 'pre.' } } };
  globalThis.sessionStorage = { getItem: (k) => store.get(k) ?? null, setItem: (k, v) => store.set(k, v),
    removeItem: (k) => store.delete(k) };
  assert.equal(tokenKey('r1'), 'pre.r1');
  assert.equal(savedToken('r1'), null);
  saveToken('r1', 'secret');
  assert.deepEqual(JSON.parse(store.get('pre.r1')), { token: 'secret' });
  assert.equal(savedToken('r1'), 'secret');
  forgetToken('r1');
  assert.equal(savedToken('r1'), null);
  globalThis.document.documentElement.dataset = {};
  assert.throws(() => tokenKey('r1'), /data-run-token-key/);
});

test('a trained run\'s token still authorizes; a resume link hands it over and leaves the bar', () => {
  const store = new Map();
  globalThis.document = { documentElement: { dataset: { runTokenKey: 'pre.' } } };
  globalThis.sessionStorage = { getItem: (k) => store.get(k) ?? null, setItem: (k, v) => store.set(k, v),
    removeItem: (k) => store.delete(k) };
  assert.deepEqual(withToken('r1', { method: 'DELETE' }), { method: 'DELETE' });   // none held
  saveToken('r1', 'secret');
  retireToken('r1');
  assert.equal(savedToken('r1'), null);          // not trained again on a reload
  assert.equal(heldToken('r1'), 'secret');
  assert.deepEqual(withToken('r1', { method: 'PATCH', headers: { 'content-type': 'application/json' } }),
    { method: 'PATCH', headers: { 'content-type': 'application/json', authorization: 'Bearer secret' } });
  const link = resumeLink('http://workshop.lan:8000', 'r2', 'a+b/c');
  assert.equal(link, 'http://workshop.lan:8000/runs/r2#token=a%2Bb%2Fc');
  const url = new URL(link);
  const replaced = [];
  const hist = { state: null, replaceState: (s, t, u) => replaced.push(u) };
  assert.equal(takeLinkToken('r2', url, hist), true);
  assert.equal(savedToken('r2'), 'a+b/c');
  assert.deepEqual(replaced, ['/runs/r2']);
  assert.equal(takeLinkToken('r3', new URL('http://x/runs/r3'), hist), false);
  assert.equal(heldToken('r3'), null);
});

test('a room\'s join link leaves its token in this tab, apart from any write token, and the bar', () => {
  const store = new Map();
  globalThis.document = { documentElement: { dataset: { runTokenKey: 'pre.' } } };
  globalThis.sessionStorage = { getItem: (k) => store.get(k) ?? null, setItem: (k, v) => store.set(k, v),
    removeItem: (k) => store.delete(k) };
  const replaced = [];
  const hist = { state: null, replaceState: (s, t, u) => replaced.push(u) };
  assert.equal(takeJoinToken('r1', new URL('http://x/runs/r1#join=j%2B1'), hist), 'j+1');
  assert.deepEqual(replaced, ['/runs/r1']);
  assert.equal(takeJoinToken('r1', new URL('http://x/runs/r1'), hist), 'j+1');   // kept
  assert.equal(heldToken('r1'), null);          // a participant is never the run's owner
  assert.equal(takeJoinToken('r2', new URL('http://x/runs/r2'), hist), null);
});
