// Text of the model's samples, and user text as the pages show it (no DOM until a helper that
// makes an element is called: tests/js runs it under Node).

// Unicode's bidi controls (embeddings, overrides, isolates, marks): in a run name, a tag or a
// sample they could reorder that text or the text around it (U+202E then "gnp.exe" reads
// "exe.png"). server/shown.py neutralises the same set in the server's pages.
const BIDI_CONTROLS = /[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;

/** User text (names, tags, notes, corpus and sample text) as a page shows it: every bidi
 *  control replaced by U+FFFD, visible, so it can reorder nothing. For titles, attributes and
 *  dialogs; in the DOM, setShown also isolates it. */
export function shownText(text) {
  return String(text ?? '').replace(BIDI_CONTROLS, '\ufffd');
}

/** `el` showing user text: shownText, and isolated from its neighbours with its own direction
 *  (dir="auto": an Arabic or Hebrew name stays whole and moves nothing around it). */
export function setShown(el, text) {
  el.textContent = shownText(text);
  el.dir = 'auto';
  return el;
}

/** A <bdi> of user text (setShown), for text shown inside a sentence. */
export const isolated = (text) => setShown(document.createElement('bdi'), text);

/** Token ids -> text that never shows a broken character: bytes of an incomplete UTF-8
 *  sequence at the end are kept and joined with the next piece's continuation bytes (the
 *  trainer decodes a sample's prompt, then its continuation); orphan continuation bytes at
 *  the start of a piece are dropped. */
export function utf8Decoder({ token_bytes_b64: table }) {
  const bytes = table.map((b64) => Uint8Array.from(atob(b64), (c) => c.charCodeAt(0)));
  const utf8 = new TextDecoder('utf-8', { fatal: false });
  let tail = new Uint8Array();
  return (ids) => {
    const parts = ids.map((id) => bytes[id] ?? new Uint8Array());
    let buf = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
    let o = 0;
    for (const p of parts) { buf.set(p, o); o += p.length; }
    const cont = (b) => (b & 0xc0) === 0x80;
    if (tail.length && buf.length && cont(buf[0])) {
      const joined = new Uint8Array(tail.length + buf.length);
      joined.set(tail);
      joined.set(buf, tail.length);
      buf = joined;
    }
    tail = new Uint8Array();
    let start = 0;
    while (start < buf.length && cont(buf[start])) start++;
    // An incomplete sequence at the end: its lead byte says how long it should be.
    let end = buf.length;
    for (let i = buf.length - 1; i >= Math.max(start, buf.length - 4); i--) {
      const b = buf[i];
      if (cont(b)) continue;
      const need = b >= 0xf0 ? 4 : b >= 0xe0 ? 3 : b >= 0xc0 ? 2 : 1;
      if (buf.length - i < need) { end = i; tail = buf.slice(i); }
      break;
    }
    return utf8.decode(buf.subarray(start, end));
  };
}
