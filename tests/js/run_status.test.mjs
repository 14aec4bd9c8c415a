// What the runs list and the run page call a run's state (static/js/app/run_status.js): the
// stored status, corrected by whether a training tab holds the run now.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import './facts.mjs';
import { isTraining, statusLabel, statusNote } from '../../static/js/app/run_status.js';

const run = (status, connected, extra = {}) => ({ status, connected, message: null, can_resume: false, ...extra });

test('a run no trainer ever took reads "never started", with the reason', () => {
  const r = run('abandoned', false, { message: 'no training tab started this run within 90 s' });
  assert.equal(statusLabel(r), 'never started');
  assert.equal(statusNote(r), ': no training tab started this run within 90 s');
  assert.equal(isTraining(r), false);
});

test('a running or paused run without its tab reads "no training tab", and is not training', () => {
  for (const status of ['running', 'paused']) {
    assert.equal(statusLabel(run(status, false)), 'no training tab');
    assert.equal(isTraining(run(status, false)), false);
  }
  assert.match(statusNote(run('running', false, { can_resume: true })), /last checkpoint/);
  assert.match(statusNote(run('running', false)), /before its first checkpoint/);
});

test('with its tab a run reads as its status; only a running one is training', () => {
  assert.equal(statusLabel(run('running', true)), 'running');
  assert.equal(isTraining(run('running', true)), true);
  assert.equal(statusLabel(run('paused', true)), 'paused');
  assert.equal(isTraining(run('paused', true)), false);
  assert.equal(statusNote(run('running', true)), '');
});

test('a new run waits for its tab, then starts', () => {
  assert.equal(statusLabel(run('created', false)), 'waiting for a training tab');
  assert.equal(statusLabel(run('created', true)), 'starting');
});

test('ended runs read as their status, with their message', () => {
  for (const s of ['finished', 'stopped', 'failed', 'interrupted']) {
    assert.equal(statusLabel(run(s, false)), s);
    assert.equal(isTraining(run(s, false)), false);
  }
  assert.equal(statusNote(run('failed', false, { message: 'the loss became non-finite' })),
    ': the loss became non-finite');
  assert.equal(statusNote(run('finished', false, { message: 'x' })), '');
});

test('the page may override what the last message said about the trainer', () => {
  const r = run('running', false);
  assert.equal(statusLabel(r, true), 'running');       // a record came after that message
  assert.equal(isTraining(r, true), true);
});
