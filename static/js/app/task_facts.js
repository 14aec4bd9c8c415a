// A run's words: the tokenizer that decodes its samples and, for a toy task run
// (server/tasks.py), the task's facts (its alphabet, problem length and where the answers
// lie) that the trainer's accuracy and samples read.
import { fetchJson } from './api.js';
import { routePath } from './facts.js';

/** The key of a run's tokenizer (GET /api/tokenizer/{key}): `task`, the toy tasks' alphabet,
 *  or the corpus tokenizer of the run's vocabulary size. */
export function tokenizerKey(config) {
  return config.task ? 'task' : config.vocab_size;
}

/** A task run's facts (GET /api/tasks/{task}), or null for a corpus run. */
export function taskFacts(config) {
  if (!config.task) return Promise.resolve(null);
  return fetchJson(`${routePath('task_info', { task: config.task })}?digits=${config.task_digits}`);
}
