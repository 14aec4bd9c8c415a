// Token ids -> text with the run's byte-level BPE tokenizer (GET /api/tokenizer/{preset}
// gives every id's bytes as base64), so the browser needs no BPE implementation.

export function makeDecoder({ token_bytes_b64: table }) {
  const bytes = table.map((b64) => Uint8Array.from(atob(b64), (c) => c.charCodeAt(0)));
  const utf8 = new TextDecoder('utf-8', { fatal: false });
  return (ids) => {
    const parts = ids.map((id) => bytes[id] ?? new Uint8Array());
    const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
    let o = 0;
    for (const p of parts) { out.set(p, o); o += p.length; }
    return utf8.decode(out);
  };
}
