// Websocket clients for the telemetry protocol (server/telemetry/protocol.py).
//
// TrainerSocket keeps every record until the server acks its step, flushes every 250 ms, and
// after a reconnect resends what the server has not committed: no step is lost or duplicated;
// its last status goes first again.
// How many records go in one message is the server's to say (welcome.records_per_message).
// Viewer sockets receive committed records (backlog first) and reconnect on their own, asking
// only for the records after the last one they have. A full disk on the server closes the
// trainer socket with 1013 and a message: the records stay unacked here and are resent.
// The server's storage budget used up (its data dir at its free-space floor, or the run at its
// byte budget) closes it with STORAGE_BUDGET (4507, reason "disk_floor: ..." or "run_bytes:
// ..."): onState says 'storage' with the server's message, the records stay unacked here, and
// it tries again every STORAGE_RETRY_MS (no hot loop), so training goes on committing once
// space is freed.
// A final refusal (1008: a revoked token, another trainer; 1003: bad data) ends the socket for
// good: every promise a caller waits on (committed, sync, and any made later) rejects with a
// SocketRefused carrying the server's reason, and onState says 'refused'.

import { FACTS, routePath } from './facts.js';

const FLUSH_MS = 250;
/** The trainer socket's close code for "the server's storage budget is used up", and the kind
 *  of refusal that is retried (server/telemetry/protocol.py STORAGE_BUDGET, BUSY: page facts);
 *  how long it waits before trying again. */
export const STORAGE_BUDGET = FACTS.protocol.storage_budget;
export const STORAGE_RETRY_MS = 30_000;
const wsUrl = (path) => `${location.protocol === 'https:' ? 'wss' : 'ws'}://${location.host}${path}`;

/** The server refused this tab's trainer socket for good: `code` (1008, 1003) and `reason`
 *  (its error message, else the close frame's reason). */
export class SocketRefused extends Error {
  constructor(code, reason) {
    super(`the server refused this tab's trainer socket (${code}): ${reason}`);
    Object.assign(this, { name: 'SocketRefused', code, reason });
  }
}

export class TrainerSocket {
  /** `WebSocket` and `url` (default: this page's origin) are there for tests. */
  constructor(runId, token, { onState = () => {}, WebSocket: WS = globalThis.WebSocket,
    url = null } = {}) {
    Object.assign(this, { runId, token, onState, WS, url });
    this.failed = null;       // a SocketRefused once the server refused this socket for good
    this.lastError = null;    // the server's last error message (sent before it closes)
    this.lastKind = null;     // ... and its kind, where a client acts on it (protocol.py)
    this.storage = null;      // the server's message while its storage budget is used up
    this.lastStatus = null;   // the last status message sent: sent again after each reconnect
    this.unacked = [];        // records in step order, not yet committed
    this.control = [];        // status / sample messages, sent in order once connected
    this.lastAcked = null;
    this.sentUpTo = null;     // highest step sent on the current connection
    this.perMessage = null;   // records per metrics message, from the server's welcome
    this.maxBytes = null;     // the server's limit on a message's bytes, from its welcome
    this.ws = null;
    this.closed = false;
    this.retry = 500;
    this.busyRetries = 0;
    this.ackWaiters = [];
    this.pongWaiters = [];
    this.connect();
    this.timer = setInterval(() => this.flush(), FLUSH_MS);
  }

  connect() {
    if (this.closed || this.failed) return;
    const ws = new this.WS(this.url ?? wsUrl(routePath('trainer_socket', { run_id: this.runId })));
    this.ws = ws;
    this.ready = false;
    this.lastError = null;
    this.lastKind = null;
    ws.onopen = () => ws.send(JSON.stringify({ type: 'hello', token: this.token,
      last_acked_step: this.lastAcked }));
    ws.onmessage = (ev) => this.handle(JSON.parse(ev.data));
    ws.onclose = (ev) => {
      this.ready = false;
      this.onState('disconnected', ev.reason);
      // This tab's previous socket may still count as the run's trainer for a moment after a
      // network drop: "another trainer holds this run" (kind busy) is retried a few times
      // before it is final.
      const busy = ev.code === 1008 && this.lastKind === FACTS.protocol.busy && this.busyRetries++ < 8;
      if (this.closed) return;
      if ((ev.code === 1008 || ev.code === 1003) && !busy) {
        // The close frame's reason is cut at 123 bytes: the error message before it is whole.
        this.fail(new SocketRefused(ev.code, this.lastError || ev.reason || 'no reason given'));
        return;
      }
      if (ev.code === STORAGE_BUDGET) {
        // Nothing of the refused message was stored: everything unacked is kept, a status
        // among what was refused is sent again; tried again slowly, not in a loop.
        this.storage = this.lastError || ev.reason || 'the server\'s storage budget is used up';
        this.onState('storage', this.storage);
        setTimeout(() => this.connect(), STORAGE_RETRY_MS);
        return;
      }
      setTimeout(() => this.connect(), this.retry);
      this.retry = Math.min(this.retry * 2, 8000);
    };
  }

  handle(msg) {
    if (msg.type === 'welcome') {
      this.ready = true;
      this.retry = 500;
      this.busyRetries = 0;
      this.storage = null;
      this.perMessage = msg.records_per_message;
      this.maxBytes = msg.max_message_bytes ?? 1 << 20;
      this.markAcked(msg.last_committed_step);
      this.sentUpTo = this.lastAcked;   // resend everything after the committed step
      // ... and the last status first: one the server refused (a full disk) is sent again,
      // and a run it marked interrupted while this tab was away reads running (or paused).
      if (this.lastStatus && !this.control.includes(this.lastStatus)) this.control.unshift(this.lastStatus);
      // A ping lost with the old connection: its waiters get the pong of a new one.
      if (this.pongWaiters.length && !this.control.some((m) => m.type === 'ping')) {
        this.control.push({ type: 'ping' });
      }
      this.onState('connected');
      this.flush();
    } else if (msg.type === 'ack') {
      this.markAcked(msg.step);
    } else if (msg.type === 'pong') {
      this.pongWaiters.splice(0).forEach(([resolve]) => resolve());
    } else if (msg.type === 'error') {
      this.lastError = msg.message;
      this.lastKind = msg.kind ?? null;
      this.onState('error', msg.message);
    }
  }

  markAcked(step) {
    if (step === null || step === undefined) return;
    this.lastAcked = Math.max(this.lastAcked ?? -1, step);
    while (this.unacked.length && this.unacked[0].step <= this.lastAcked) this.unacked.shift();
    this.ackWaiters = this.ackWaiters.filter(([s, resolve]) => (s <= this.lastAcked ? resolve() : true));
  }

  /** Refused for good: no more reconnects or flushes, every waiter rejected with `error`. */
  fail(error) {
    if (this.failed) return;
    this.failed = error;
    this.ready = false;
    clearInterval(this.timer);
    const waiters = [...this.ackWaiters.splice(0).map(([, , reject]) => reject),
      ...this.pongWaiters.splice(0).map(([, reject]) => reject)];
    waiters.forEach((reject) => reject(error));
    this.onState('refused', error.reason);
  }

  push(record) { this.unacked.push(record); }

  send(message) {
    if (message.type === 'status') this.lastStatus = message;
    this.control.push(message);
    this.flush();
  }

  flush() {
    if (!this.ready || this.ws.readyState !== (this.WS.OPEN ?? 1)) return;
    while (this.control.length) this.ws.send(JSON.stringify(this.control.shift()));
    const fresh = this.unacked.filter((r) => this.sentUpTo === null || r.step > this.sentUpTo);
    // At most perMessage records and half the server's byte limit a message (a big batch's
    // row_losses make records of kilobytes).
    let parts = [];
    let bytes = 0;
    const send = () => {
      if (parts.length) this.ws.send(`{"type":"metrics","records":[${parts.join(',')}]}`);
      parts = [];
      bytes = 0;
    };
    for (const r of fresh) {
      const text = JSON.stringify(r);
      if (parts.length >= this.perMessage || bytes + text.length > this.maxBytes / 2) send();
      parts.push(text);
      bytes += text.length + 1;
    }
    send();
    if (fresh.length) this.sentUpTo = fresh[fresh.length - 1].step;
  }

  /** Resolves once every record up to `step` is committed; rejects (SocketRefused) if the
   *  server refuses this socket for good first. */
  committed(step) {
    // (Step 0: nothing to commit. A run that ends before its first record waits for no ack.)
    if ((this.lastAcked ?? 0) >= step) return Promise.resolve();
    if (this.failed) return Promise.reject(this.failed);
    return new Promise((resolve, reject) => this.ackWaiters.push([step, resolve, reject]));
  }

  /** Resolves when the server has processed everything sent before (a ping's pong); rejects
   *  (SocketRefused) if the server refuses this socket for good first. */
  sync() {
    if (this.failed) return Promise.reject(this.failed);
    return new Promise((resolve, reject) => {
      this.pongWaiters.push([resolve, reject]);
      this.send({ type: 'ping' });
    });
  }

  close() {
    this.flush();
    this.closed = true;
    clearInterval(this.timer);
    this.ws?.close(1000);
  }
}

/**
 * Read-only viewer: onMessage gets every server message; reconnects after drops. It remembers
 * the last step it received, so a reconnect (?after=N) resends only what came after (the
 * server is told nothing else: a live "resumed" notice moves that step back).
 */
export function watch(runId, onMessage, onState = () => {}) {
  let retry = 500;
  let stopped = false;
  let last = null;          // every record up to this step has been received
  const open = () => {
    const after = last === null ? '' : `?after=${last}`;
    const ws = new WebSocket(wsUrl(`${routePath('viewer_socket', { run_id: runId })}${after}`));
    ws.onopen = () => { retry = 500; onState('connected'); };
    ws.onmessage = (ev) => {
      const msg = JSON.parse(ev.data);
      if (msg.type === 'records' && msg.records.length) {
        last = Math.max(last ?? -1, msg.records[msg.records.length - 1].step);
      } else if (msg.type === 'resumed' && msg.kind === undefined && last !== null) {
        last = Math.min(last, msg.step);
      }
      onMessage(msg);
    };
    ws.onclose = (ev) => {
      onState('disconnected', ev.reason);
      if (stopped || ev.code === 1008 || ev.code === 1003) return;
      // 1013: this tab fell behind and was dropped; it catches up from `last` at once.
      setTimeout(open, ev.code === 1013 ? 100 : retry);
      retry = Math.min(retry * 2, 8000);
    };
  };
  open();
  return () => { stopped = true; };
}
