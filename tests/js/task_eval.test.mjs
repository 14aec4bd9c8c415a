// A toy task's exact-match accuracy (engine/task_eval.js) against the server's own
// (server/tasks.py exact_match) on the server's batches, with predictions that are right,
// wrong in one answer token, or wrong only outside the answers.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { argmaxRows, exactMatch } from '../../static/js/engine/task_eval.js';
import { serverJson } from './server.mjs';

// Per task: the server's batch, its facts, and predictions [B, T] each with the count Python's
// exact_match gives them.
const CASES = serverJson(`
import json, numpy as np
from andrea import tasks
out = []
for task, digits, T in [("reverse", 5, 64), ("add", 3, 40), ("mod", None, 30), ("sort", 7, 15)]:
    f = tasks.facts(task, digits)
    tok = tasks.rows(task, digits, 3, 7, "val", 5, T)
    rng = np.random.default_rng(0)
    right = tok[:, 1:].copy()                  # every prediction the next token
    preds = [right]
    wrong = right.copy()                       # one answer token wrong in row 1's first problem
    wrong[1, f.answer_start - 1] = (wrong[1, f.answer_start - 1] + 1) % tasks.VOCAB
    preds.append(wrong)
    prompt = right.copy()                      # only prompt positions wrong: still all right
    prompt[:, 0] = (prompt[:, 0] + 3) % tasks.VOCAB
    preds.append(prompt)
    preds.append(rng.integers(0, tasks.VOCAB, right.shape))
    out.append({"facts": f.to_dict(), "T": T, "tokens": tok.tolist(),
                "preds": [p.tolist() for p in preds],
                "expect": [list(tasks.exact_match(tok, p, f)) for p in preds]})
print(json.dumps(out))`);

test('exactMatch counts what the server counts, for each task and prediction', () => {
  for (const c of CASES) {
    const B = c.tokens.length;
    const targets = Uint32Array.from(c.tokens.flatMap((row) => row.slice(1)));
    c.preds.forEach((p, i) => {
      const { right, total } = exactMatch(Int32Array.from(p.flat()), targets, B, c.T, c.facts);
      assert.deepEqual([right, total], c.expect[i], `${c.facts.task} prediction ${i}`);
    });
    assert.equal(c.expect[0][0], c.expect[0][1], `${c.facts.task}: the true next tokens answer all`);
    assert.equal(c.expect[1][0], c.expect[1][1] - 1, `${c.facts.task}: one wrong token, one problem`);
  }
});

test('argmaxRows takes each row\'s first largest logit', () => {
  const V = 4;
  const logits = Float32Array.from([0, 3, 1, 3, -5, -4, -6, -7, 2, 2, 2, 2]);
  assert.deepEqual([...argmaxRows(logits, V)], [1, 1, 0]);
});
