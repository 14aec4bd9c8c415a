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

// engine/trainer.js joins a sample's prompt and the model's continuation with this marker.
export const SAMPLE_JOIN = '\u27e8\u2026\u27e9';

export const MARK_TITLES = {
  undecodable: 'bytes that are not valid UTF-8 on their own (a token boundary inside a character, ' +
    'or byte tokens that make no character)',
  bidi: 'a bidi control, not applied: it could reorder the text around it',
  control: 'a control character, shown as its symbol',
};

// What a sample shows as a mark: control characters but newline and tab (C0, DEL, C1), U+FFFD
// and the bidi controls.
const MARKED = new RegExp(`[\\u0000-\\u0008\\u000b-\\u001f\\u007f-\\u009f\\ufffd]|${BIDI_CONTROLS.source}`, 'g');
const BIDI_CONTROL = new RegExp(`^${BIDI_CONTROLS.source}$`);

/** Sample text as runs to show: {text} as it is, or {text, mark, title} for a character that
 *  would be invisible, misleading or mistaken for the model's own: U+FFFD (undecodable bytes),
 *  a bidi control (shown as U+FFFD, as shownText does), a control character (its Unicode
 *  control picture, U+2400 + code; DEL U+2421; a C1 control its code). */
export function sampleParts(text) {
  const parts = [];
  const str = String(text ?? '');
  let at = 0;
  for (const m of str.matchAll(MARKED)) {
    if (m.index > at) parts.push({ text: str.slice(at, m.index) });
    at = m.index + 1;
    const c = m[0];
    const code = c.codePointAt(0);
    const hex = `U+${code.toString(16).toUpperCase().padStart(4, '0')}`;
    if (c === '\ufffd') parts.push({ text: c, mark: 'undecodable', title: MARK_TITLES.undecodable });
    else if (BIDI_CONTROL.test(c)) parts.push({ text: '\ufffd', mark: 'bidi', title: `${MARK_TITLES.bidi} (${hex})` });
    else {
      const picture = code < 0x20 ? String.fromCharCode(0x2400 + code) : code === 0x7f ? '\u2421' : hex;
      parts.push({ text: picture, mark: 'control', title: `${MARK_TITLES.control} (${hex})` });
    }
  }
  if (at < str.length) parts.push({ text: str.slice(at) });
  return parts;
}

/** A sample as the run page shows it: a <bdi> (isolated, as user text is) holding the prompt
 *  (span.sample-prompt) and the model's continuation (span.sample-out), each with its marks
 *  (sampleParts: span.sample-mark with a title). A sample without the join marker is all the
 *  model's. */
export function sampleNode(text) {
  const str = String(text ?? '');
  const join = str.indexOf(SAMPLE_JOIN);
  const bdi = document.createElement('bdi');
  bdi.dir = 'auto';
  const piece = (cls, part, title) => {
    const span = Object.assign(document.createElement('span'), { className: cls, title });
    for (const p of sampleParts(part)) {
      if (!p.mark) { span.append(p.text); continue; }
      const mark = Object.assign(document.createElement('span'),
        { className: 'sample-mark', textContent: p.text, title: p.title });
      mark.dataset.mark = p.mark;
      span.append(mark);
    }
    return span;
  };
  if (join >= 0) {
    bdi.append(piece('sample-prompt', str.slice(0, join), 'prompt: the start of a training row'),
      piece('sample-out', str.slice(join + SAMPLE_JOIN.length), 'what the model wrote after the prompt'));
  } else {
    bdi.append(piece('sample-out', str, 'what the model wrote'));
  }
  return bdi;
}

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
