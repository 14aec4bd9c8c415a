// A spike's anatomy in the run page's spike list, from GET /api/runs/{id}/spikes (each part only
// where the server has it: server/spike_anatomy.py): the tensors and the layer that carry the
// step's gradient (shares of its squared norm), its non-finite gradient elements per tensor,
// the numerical flags, and what the loss kernel saw (largest |logit|, smallest softmax
// denominator).
import { fmtValue } from './format.js';

const pct = (share) => `${(share * 100).toFixed(1)} %`;

const el = (tag, props = {}, ...children) => {
  const e = Object.assign(document.createElement(tag), props);
  e.append(...children);
  return e;
};

/** The summary line's tail: the tensor with the largest share ("" without tensors). */
export function topTensorText(s) {
  const top = s.tensors?.[0];
  return top ? `, mostly ${top.name ?? `tensor ${top.index}`} (${pct(top.share)})` : '';
}

/** The anatomy's elements for one spike (none when the record had nothing of it). */
export function anatomyParts(s) {
  const out = [];
  if (s.tensors?.length) {
    const table = el('table', { className: 'spike-tensors' });
    const head = table.createTHead().insertRow();
    for (const h of ['tensor', 'grad norm', 'share of the squared norm']) head.append(el('th', { textContent: h }));
    const body = table.createTBody();
    for (const t of s.tensors) {
      const tr = body.insertRow();
      tr.dataset.index = String(t.index);
      tr.insertCell().textContent = t.name ?? `tensor ${t.index}`;
      tr.insertCell().append(num(fmtValue(t.norm)));
      tr.insertCell().append(num(pct(t.share)));
    }
    out.push(el('p', { textContent: 'Tensors that carried it (before clipping):' }), table);
  }
  if (s.layer) {
    out.push(el('p', { className: 'spike-layer', textContent: `Layer: ${s.layer.name}, ` +
      `${pct(s.layer.share)} of the squared norm` +
      (s.layer.norm === undefined ? '' : ` (its norm ${fmtValue(s.layer.norm)})`) }));
  }
  if (s.nonfinite) {
    const { total, affected, tensors } = s.nonfinite;
    const where = tensors.map((t) => `${t.name ?? `tensor ${t.index}`}: ${t.count}`).join(', ');
    out.push(el('p', { className: 'spike-nonfinite', textContent: `Non-finite gradient elements: ` +
      `${total}${affected === undefined ? '' : ` in ${affected} tensor${affected === 1 ? '' : 's'}`}` +
      (where ? ` (${where})` : '') }));
  }
  for (const f of s.numerical ?? []) {
    const p = el('p', { className: 'spike-flag', textContent: f.text });
    p.dataset.flag = f.flag;
    out.push(p);
  }
  const kernel = [];
  if (s.logit_max !== undefined && s.logit_max !== null) kernel.push(`largest |logit| ${fmtValue(s.logit_max)}`);
  if (s.softmax_denom_min !== undefined && s.softmax_denom_min !== null) {
    kernel.push(`smallest softmax denominator ${fmtValue(s.softmax_denom_min)} (1: one token takes a row)`);
  }
  if (kernel.length) out.push(el('p', { className: 'spike-kernel', textContent: `Loss kernel: ${kernel.join(', ')}` }));
  return out.length ? [el('div', { className: 'spike-anatomy' }, ...out)] : [];
}

function num(text) {
  return el('span', { className: 'num', textContent: text });
}
