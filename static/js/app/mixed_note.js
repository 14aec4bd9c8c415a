// Why mixed precision cannot run in this browser, and what could change that: one text for the
// new-run form's note and for a mixed run's page that cannot train here.

import { FACTS } from './facts.js';

const NVIDIA_FLAGS = `--enable-dawn-features=${FACTS.mixed_dawn_toggles.join(',')}`;

/** The sentence after "...needs f16 subgroup matrices": what this adapter lacks (`why`, from
 *  mixedSupport or the refused device) and the remedy. `ctx`: the adapter as the engine sees it
 *  ({info, software, adapter}: engine/context.js or gpu.js acquireDevice; null: none could be
 *  had). A software adapter (SwiftShader) never has f16 subgroup matrices, whatever the flags;
 *  on a GPU a flag is named only for a feature its adapter lacks (Chrome holds both back
 *  without them), so flags already on are not suggested again. `fallback`: what to do instead
 *  (the form: choose fp32; a run's page: a new run in fp32). */
export function mixedMissing(why, ctx, fallback) {
  const reason = why.replace(/\.$/, '').replace(/^[A-Z](?=[a-z])/, (c) => c.toLowerCase());
  if (ctx?.software) {
    const name = `${ctx.info.vendor} ${ctx.info.architecture}`.trim();
    return `this browser's adapter is a software one${name ? ` (${name})` : ''}: ${reason}. ` +
      `A software adapter never has f16 subgroup matrices: ${fallback}, or use a browser on a GPU`;
  }
  const has = (f) => ctx?.adapter?.features?.has(f) ?? false;
  const unsafe = !has('chromium-experimental-subgroup-matrix');
  const f16 = !has('shader-f16');
  if (!unsafe && !f16) {
    return `this GPU's adapter has the features but not what the engine's kernel needs: ` +
      `${reason}. ${capital(fallback)}`;
  }
  const how = unsafe ? `with --enable-unsafe-webgpu${f16 ? `; on NVIDIA also ${NVIDIA_FLAGS}` : ''}`
    : `on NVIDIA with ${NVIDIA_FLAGS}`;
  return `this browser's adapter cannot give them: ${reason}. ` +
    (ctx ? `Chrome offers them ${how}`
      : `On a GPU, Chrome offers them ${how}; a software adapter never has them`);
}

/** The new-run form's note under Precision, for this adapter's mixed support ({ok, why}: the
 *  engine's ctx.mixed; `ctx` as mixedMissing's) and the precision chosen (`precision`). Where
 *  mixed precision is offered, the note speaks of it only while it is chosen: on fp32 (the
 *  default) a note that it "runs its matmuls" on the matrix units read as if the run did, and
 *  an fp32 run uses none. Where it is not offered, the note says why its option is disabled and
 *  what could change that, whatever is chosen (mixed cannot be). '': no note. */
export function precisionNote({ ok, why }, ctx, precision) {
  if (ok) {
    return precision === 'mixed'
      ? 'This GPU has f16 matrix units for WGSL: mixed precision runs its matmuls there.' : '';
  }
  return 'Mixed precision needs f16 subgroup matrices (WGSL\'s matrix units), and ' +
    `${mixedMissing(why, ctx, 'choose fp32')}.`;
}

const capital = (s) => s.charAt(0).toUpperCase() + s.slice(1);
