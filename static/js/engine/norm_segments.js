// The gradient-norm plan of 12_optimizer.wgsl: every parameter tensor's range cut into segments
// of at most `span` elements at multiples of `span` (the reduce kernel's partial), so that one
// workgroup sums one segment, each tensor's norm is the fixed-order sum of its own segments, and
// no segment straddles a tensor or a binding window (windows are whole multiples of span). The
// same elements land in the same partial however the bindings are split: bitwise reproducible.

/**
 * layout: server/model.py's (params in buffer order, offsets and numel in elements).
 * Returns {segs: Uint32Array [4 S] (start element, end element, tensor, 0), tsegs: Uint32Array
 * [4 T] (first segment, end segment, 0, 0), count: S}.
 */
export function normSegments(layout, span) {
  const list = [];
  const tsegs = new Uint32Array(4 * layout.params.length);
  let prevEnd = 0;
  layout.params.forEach((p, t) => {
    const end = p.offset + p.numel;
    if (p.offset < prevEnd) throw new Error(`norm segments: ${p.name} overlaps the tensor before it`);
    prevEnd = end;
    tsegs[4 * t] = list.length;
    for (let a = p.offset; a < end; a = (Math.floor(a / span) + 1) * span) {
      list.push([a, Math.min(end, (Math.floor(a / span) + 1) * span), t]);
    }
    tsegs[4 * t + 1] = list.length;
  });
  const segs = new Uint32Array(4 * list.length);
  list.forEach(([a, b, t], i) => segs.set([a, b, t, 0], 4 * i));
  return { segs, tsegs, count: list.length };
}

/** The segments [first, end) whose start lies in [base, base + len): those a window binds. */
export function windowSegments(segs, count, base, len) {
  let first = 0;
  while (first < count && segs[4 * first] < base) first++;
  let end = first;
  while (end < count && segs[4 * end] < base + len) end++;
  return [first, end];
}
