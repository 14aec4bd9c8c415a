// Number, duration, byte and count formats for the pages and their charts (no DOM: tests/js
// runs them under Node).

const trimZeros = (s) => s.replace(/(\.\d*?)0+(e|$)/, '$1$2').replace(/\.(e|$)/, '$1');
const sci = (a) => a !== 0 && (a >= 1e5 || a < 1e-3);

/** A value for reading (hover, stats): 4 significant digits, scientific below 1e-3 or from 1e5
 *  ("3e-4", "0.0123", "5.432", "1.2e+6"). */
export function fmtValue(v, digits = 4) {
  if (v === null || v === undefined || Number.isNaN(v)) return '–';
  if (!Number.isFinite(v)) return v > 0 ? '∞' : '-∞';
  const a = Math.abs(v);
  if (a === 0) return '0';
  if (sci(a)) return trimZeros(v.toExponential(digits - 1)).replace('e+', 'e');
  return trimZeros(v.toPrecision(digits));
}

/** Tick labels: the fewest digits that keep every label of the axis distinct. */
export function tickLabels(splits) {
  const vals = splits.filter((v) => v !== null && Number.isFinite(v));
  const maxAbs = vals.reduce((m, v) => Math.max(m, Math.abs(v)), 0);
  const useSci = sci(maxAbs);
  for (let d = 0; d <= 8; d++) {
    const labels = splits.map((v) => {
      if (v === null || !Number.isFinite(v)) return '';
      if (v === 0) return '0';
      return useSci ? trimZeros(v.toExponential(Math.min(d, 6))).replace('e+', 'e')
        : v.toFixed(d);
    });
    const shown = labels.filter((l) => l !== '');
    if (new Set(shown).size === shown.length) return labels;
  }
  return splits.map((v) => fmtValue(v));
}

/** Seconds as "4.2 s", "42 s", "3 min 20 s", "2 h 05 min". Rounded to the unit shown last
 *  before it is split, so 479.6 s reads "8 min 00 s", never "7 min 60 s". */
export function fmtDuration(s) {
  if (s === null || s === undefined || !Number.isFinite(s)) return '–';
  s = Math.max(0, s);
  const tenths = Math.round(s * 10) / 10;
  if (tenths < 10) return `${tenths.toFixed(1)} s`;
  const secs = Math.round(s);
  if (secs < 60) return `${secs} s`;
  if (secs < 3600) return `${Math.floor(secs / 60)} min ${String(secs % 60).padStart(2, '0')} s`;
  const mins = Math.round(s / 60);
  return `${Math.floor(mins / 60)} h ${String(mins % 60).padStart(2, '0')} min`;
}

/** Tick labels of an elapsed-seconds axis: "45s", "3:20", "1:05:00". */
export function durationTicks(splits) {
  return splits.map((s) => {
    if (s === null) return '';
    const t = Math.round(s);
    if (t < 60 && splits.every((x) => x === null || x < 60)) return `${t}s`;
    const h = Math.floor(t / 3600);
    const m = Math.floor((t % 3600) / 60);
    const ss = String(t % 60).padStart(2, '0');
    return h ? `${h}:${String(m).padStart(2, '0')}:${ss}` : `${m}:${ss}`;
  });
}

/** Bytes as "512 B", "14.2 KiB", "3.4 MiB", "90.5 GiB". */
export function fmtBytes(b) {
  if (b === null || b === undefined) return '–';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (Math.abs(b) >= 1024 && i < units.length - 1) { b /= 1024; i++; }
  return i === 0 ? `${b} B` : `${b.toFixed(b >= 100 ? 0 : 1)} ${units[i]}`;
}

/** Optimizer state bytes per parameter (the layout's bytes_per_param, to 4 decimals) as the
 *  design states them: 3 significant digits, trailing zeros dropped ("8 B/param", fp32 m and v
 *  on a layout whose padding adds 0.018: "8.02 B/param", 8-bit: "2.03 B/param"). */
export function fmtBytesPerParam(b) {
  return `${fmtValue(b, 3)} B/param`;
}

/** Counts as "950", "12.3 k", "4.56 M", "1.2 B". */
export function fmtCount(n) {
  if (n === null || n === undefined) return '–';
  const a = Math.abs(n);
  if (a >= 1e9) return `${(n / 1e9).toFixed(2)} B`;
  if (a >= 1e6) return `${(n / 1e6).toFixed(2)} M`;
  if (a >= 1e3) return `${(n / 1e3).toFixed(1)} k`;
  return String(Math.round(n));
}


/** A rate in tokens per second: "4.2 tokens/s", "332 tokens/s", "12.3k tokens/s",
 *  "1.23M tokens/s" (rounded before the unit is picked: 999.7 is "1.0k", not "1000"). */
export function fmtTokensPerS(n) {
  if (n === null || n === undefined || !Number.isFinite(n)) return '–';
  const a = Math.abs(n);
  // Each threshold is where the smaller unit's rounding would reach the next one.
  let shown;
  if (a >= 999_950) shown = `${(n / 1e6).toFixed(2)}M`;
  else if (a >= 999.5) shown = `${(n / 1e3).toFixed(1)}k`;
  else shown = a < 9.95 ? n.toFixed(1) : String(Math.round(n));
  return `${shown} tokens/s`;
}
