// Checkpoints: the complete training state (W and the optimizer state, as the GPU holds it) read
// back in chunks with their SHA-256, and written back for a resume. The section list (names,
// order, byte sizes) is the server's (server/optim.py checkpoint_sections); the engine only maps
// each name to the buffer that holds it and refuses a list that does not fit its buffers.
//
//   const sections = matchSections(served, [...model.stateSections(), ...opt.stateSections()]);
//   const ckpt = await snapshotSections(device, sections, chunkBytes, liveSet, step);
//   writeSections(device, sections, data);   // resume: data = the sections concatenated
//
// The pure functions (matchSections, chunkPlan, median, toHex) are unit tested in
// tests/js/checkpoint.test.mjs; the GPU side in tests/unit/gpu/test_resume.py. When checkpoints are
// taken: checkpoint_cadence.js.

const WRITE_PIECE = 64 * 2 ** 20;   // resume: queue.writeBuffer in pieces of at most this many bytes

/**
 * served: [{name, bytes}] from the server, in checkpoint order; own: [{name, buffer, bytes}] the
 * engine's state buffers (bytes: what the engine keeps in that buffer, from its start).
 * -> [{name, buffer, bytes, offset}] in the server's order (offset: byte offset in the body).
 * Throws, naming both lists, when a name is unknown, missing, doubled or its size differs.
 */
export function matchSections(served, own) {
  const list = (l) => l.map((s) => `${s.name} ${s.bytes} B`).join(', ');
  const mismatch = (why) => new Error(`checkpoint sections do not match this engine (${why}): ` +
    `the server lists [${list(served ?? [])}], the engine holds [${list(own)}]`);
  if (!Array.isArray(served) || served.length === 0) throw mismatch('the server sent no sections');
  const byName = new Map(own.map((s) => [s.name, s]));
  const seen = new Set();
  let offset = 0;
  const out = served.map(({ name, bytes }) => {
    const mine = byName.get(name);
    if (!mine) throw mismatch(`no state buffer named ${JSON.stringify(name)}`);
    if (seen.has(name)) throw mismatch(`${name} is listed twice`);
    seen.add(name);
    if (bytes !== mine.bytes) throw mismatch(`${name} is ${bytes} B on the server, ${mine.bytes} B here`);
    if (bytes % 4) throw mismatch(`${name}: ${bytes} B is not a multiple of 4`);
    const s = { name, buffer: mine.buffer, bytes, offset };
    offset += bytes;
    return s;
  });
  const missing = own.filter((s) => !seen.has(s.name)).map((s) => s.name);
  if (missing.length) throw mismatch(`the server does not list ${missing.join(', ')}`);
  return out;
}

/** Total bytes of a section list. */
export const sectionBytes = (sections) => sections.reduce((a, s) => a + s.bytes, 0);

/**
 * The body [0, total) cut into chunks of chunkBytes (the last shorter), each with the copies that
 * fill it: [{bytes, copies: [{section, src, dst, size}]}], section = index into `sections`, src =
 * byte offset in that section's buffer, dst = byte offset in the chunk.
 */
export function chunkPlan(sections, chunkBytes) {
  if (!Number.isInteger(chunkBytes) || chunkBytes <= 0 || chunkBytes % 4) {
    throw new Error(`checkpoint chunk_bytes must be a positive multiple of 4, not ${chunkBytes}`);
  }
  const total = sectionBytes(sections);
  const chunks = [];
  for (let start = 0; start < total; start += chunkBytes) {
    const end = Math.min(start + chunkBytes, total);
    const copies = [];
    let offset = 0;
    sections.forEach((s, i) => {
      const lo = Math.max(start, offset);
      const hi = Math.min(end, offset + s.bytes);
      if (hi > lo) copies.push({ section: i, src: lo - offset, dst: lo - start, size: hi - lo });
      offset += s.bytes;
    });
    chunks.push({ bytes: end - start, copies });
  }
  return chunks;
}

/** The median of a list of numbers (NaN for none): the cadence's step time. */
export function median(values) {
  if (!values.length) return NaN;
  const s = [...values].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}

/** Bytes -> lowercase hex. */
export function toHex(buffer) {
  const b = new Uint8Array(buffer);
  let s = '';
  for (let i = 0; i < b.length; i++) s += b[i].toString(16).padStart(2, '0');
  return s;
}

export async function sha256Hex(buffer) {
  return toHex(await globalThis.crypto.subtle.digest('SHA-256', buffer));
}

/**
 * Encodes and submits copies of every section into MAP_READ staging buffers (one per chunk) now,
 * so the snapshot holds the state after the work already submitted and nothing submitted later
 * can change it; then maps them, copies each chunk out and frees its staging buffer. `live`
 * (a Set) holds the staging buffers until they are freed, for the owner's destroy().
 * Resolves to {step, parts: ArrayBuffer[], chunkSha256: string[], bytes, readMs, hashMs}.
 */
export function snapshotSections(device, sections, chunkBytes, live, step) {
  const plan = chunkPlan(sections, chunkBytes);
  const staging = plan.map((c, i) => device.createBuffer({ label: `checkpoint ${step} part ${i}`,
    size: c.bytes, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST }));
  for (const b of staging) live.add(b);
  const enc = device.createCommandEncoder({ label: `checkpoint ${step}` });
  plan.forEach((c, i) => {
    for (const k of c.copies) {
      enc.copyBufferToBuffer(sections[k.section].buffer, k.src, staging[i], k.dst, k.size);
    }
  });
  device.queue.submit([enc.finish()]);
  const t0 = performance.now();
  const maps = staging.map((b) => {
    const p = b.mapAsync(GPUMapMode.READ);
    p.catch(() => {});   // surfaced below, in order
    return p;
  });
  const release = (b) => {
    live.delete(b);
    b.destroy();
  };
  return (async () => {
    const parts = [];
    const digests = [];
    try {
      for (let i = 0; i < staging.length; i++) {
        await maps[i];
        parts.push(staging[i].getMappedRange().slice(0));   // [chunk bytes], copied out
        staging[i].unmap();
        release(staging[i]);
        digests.push(sha256Hex(parts[i]));   // hashing overlaps the next chunk's read
      }
    } finally {
      for (const b of staging) if (live.has(b)) release(b);
    }
    const readMs = performance.now() - t0;
    const chunkSha256 = await Promise.all(digests);
    return { step, parts, chunkSha256, bytes: sectionBytes(sections), readMs,
      hashMs: performance.now() - t0 - readMs };
  })();
}

/** Bytes of an ArrayBuffer or typed array as a Uint8Array view (no copy). */
export function asBytes(data) {
  if (data instanceof ArrayBuffer) return new Uint8Array(data);
  if (ArrayBuffer.isView(data)) return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  throw new Error('resume data must be an ArrayBuffer or a typed array');
}

/** Writes a checkpoint body (the sections concatenated, a Uint8Array) into the section buffers. */
export function writeSections(device, sections, bytes) {
  for (const s of sections) {
    for (let at = 0; at < s.bytes; at += WRITE_PIECE) {
      const size = Math.min(WRITE_PIECE, s.bytes - at);
      device.queue.writeBuffer(s.buffer, at, bytes, s.offset + at, size);
    }
  }
}
