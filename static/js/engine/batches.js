// Batches from the server (server/data/wire.py), parsed and prefetched a few steps ahead.
//
// Body, little-endian u32 fields: "ANDB", version 1, B, T, step, split (0 train, 1 val),
// bytes per token (4), K sources, bandit phase (0xFFFFFFFF none), tokens_offset; then B u8
// source indices (padded to 4); then B x (T + 1) u32 tokens at tokens_offset.

const NO_PHASE = 0xffffffff;

/** -> {B, T, step, split, phase, sources: Uint8Array [B], inputs, targets: Uint32Array [B, T]} */
export function parseBatch(body) {
  const h = new DataView(body);
  const magic = String.fromCharCode(h.getUint8(0), h.getUint8(1), h.getUint8(2), h.getUint8(3));
  if (magic !== 'ANDB') throw new Error(`not a batch body (magic ${JSON.stringify(magic)})`);
  const u = (i) => h.getUint32(4 * i, true);
  if (u(1) !== 1) throw new Error(`batch format version ${u(1)} is not supported`);
  const [B, T, step, split, tokenBytes, , phase, offset] = [u(2), u(3), u(4), u(5), u(6), u(7), u(8), u(9)];
  if (tokenBytes !== 4) throw new Error(`tokens of ${tokenBytes} bytes are not supported`);
  const rows = new Uint32Array(body, offset, B * (T + 1));   // [B, T + 1]
  const inputs = new Uint32Array(B * T);
  const targets = new Uint32Array(B * T);
  for (let b = 0; b < B; b++) {
    inputs.set(rows.subarray(b * (T + 1), b * (T + 1) + T), b * T);
    targets.set(rows.subarray(b * (T + 1) + 1, (b + 1) * (T + 1)), b * T);
  }
  return { B, T, step, split: split === 0 ? 'train' : 'val', phase: phase === NO_PHASE ? null : phase,
    sources: new Uint8Array(body, 40, B).slice(), inputs, targets };
}

/** Keeps `depth` future batches in flight: get(step) resolves the batch and asks for the next. */
export class Prefetcher {
  constructor(load, { depth = 3, end = Infinity } = {}) {
    this.load = load;   // async (step) => ArrayBuffer
    this.depth = depth;
    this.end = end;
    this.pending = new Map();
  }

  request(step) {
    if (step >= this.end || this.pending.has(step)) return;
    const p = this.load(step).then(parseBatch);
    p.catch(() => {});   // surfaced by get(); avoid an unhandled rejection meanwhile
    this.pending.set(step, p);
  }

  /** Training goes on from `step` (a room worker that skipped rounds): batches asked for
   *  steps before it are dropped. */
  jump(step) {
    for (const s of this.pending.keys()) if (s < step) this.pending.delete(s);
  }

  async get(step) {
    for (let s = step; s <= step + this.depth; s++) this.request(s);
    const batch = await this.pending.get(step);
    this.pending.delete(step);
    return batch;
  }
}
