// A room run's state in words (server/room/): what its open round waits for, what each worker
// does now, and its line in the runs list. No DOM: tests/js/room_words.test.mjs runs it under
// Node; room.js and runs.js show it.

/** Seconds as "1:42" (or "1:02:03"). */
export function clock(s) {
  const t = Math.max(0, Math.ceil(s));
  const h = Math.floor(t / 3600);
  const m = Math.floor((t % 3600) / 60);
  const ss = String(t % 60).padStart(2, '0');
  return h ? `${h}:${String(m).padStart(2, '0')}:${ss}` : `${m}:${ss}`;
}

/** What the open round waits for, in words: "Round 3 of 6: waiting for 1 of 4 workers,
 *  closes in 1:42" (the deadline counts from the round's first pseudo-gradient and closes it
 *  only with a quorum: Room.due). */
export function roundText(room, now) {
  if (room.finished) return `All ${room.rounds} rounds closed: the room is finished.`;
  const o = room.open;
  const active = room.workers.filter((w) => w.left === null).length;
  const head = `Round ${room.version + 1} of ${room.rounds}`;
  const deadline = room.config.round_deadline_s;
  if (!active) return `${head}: no worker trains it now; it goes on when one joins.`;
  const workers = `${active} worker${active === 1 ? '' : 's'}`;
  if (!o.received.length) {
    return `${head}: ${workers} training; it closes once each has sent its pseudo-gradient, ` +
      `or ${clock(deadline)} after the first one${room.config.quorum > 1 ? ` (with at least ${room.config.quorum})` : ''}.`;
  }
  const wait = o.waiting_for.length;
  if (!wait) return `${head}: every worker answered; closing.`;
  let closes;
  if (!o.quorum_met) {
    closes = `it needs ${room.config.quorum} pseudo-gradients to close at its deadline`;
  } else {
    const left = o.deadline_at - now;
    closes = left > 0 ? `closes in ${clock(left)}` : 'closing now (past its deadline)';
  }
  if (o.cut) return `${head}: cut (half the workers are done): waiting for ${wait} of ${workers} to send what they have trained, ${closes}.`;
  return `${head}: waiting for ${wait} of ${workers}, ${closes}.`;
}

/** What worker `w` does now (the server's worker_state), in words. */
export function workerNow(w, H) {
  switch (w.state) {
    case 'training': return `training (step ${w.step} of ${H})`;
    case 'sending': return 'sending its pseudo-gradient';
    case 'waiting': return 'waiting for the round to close';
    case 'ahead': return `training the next round (step ${w.step} of ${H}) while this one closes`;
    case 'refused': return 'its pseudo-gradient was refused';
    case 'starting': return 'starting (taking the version)';
    case 'done': return 'done';
    case 'left': return w.removed ? 'removed' : 'left';
    default: return w.state ?? '';
  }
}

/** A room run's progress in the runs list (GET /api/runs' `room`): rounds closed of all,
 *  "2 / 6 rounds (33 %)". */
export function roomProgress(room) {
  return `${room.version} / ${room.rounds} rounds (${Math.floor((100 * room.version) / room.rounds)} %)`;
}

/** A room run's state in the runs list: finished, or running with its workers now ("running ·
 *  3 workers training"; "running · no worker" between them). */
export function roomStatus(room) {
  if (room.finished) return `finished · ${room.joined} worker${room.joined === 1 ? '' : 's'} trained it`;
  if (!room.training) return 'running · no worker training';
  return `running · ${room.training} worker${room.training === 1 ? '' : 's'} training`;
}
