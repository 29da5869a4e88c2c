// The elector trace vectors (tests/conformance/elector/*.json, format in
// tests/conformance/README.md) replayed through the package's binding of the election machine:
// the same inputs at the same times must give the same outputs, in order. The vectors in broken/
// must not replay. Then calls of the elector's machine on a manual clock and a one-key store: the
// outcomes election.test.mjs measures with timers, decided by the times passed in.
import test from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { check, drain, replayTests } from './vectors.mjs';

const require = createRequire(import.meta.url);
const { ElectionRules, Table } = require('../pkg/leaselock_wasm.js');

/** A trace's machine, made as the elector makes one: from a table's timing and its options. */
function machineOf({ setup }, seed, now) {
  const table = new Table(
    JSON.stringify({ tableName: 'leases', leaseMs: setup.lease_ms, renewMs: setup.renew_ms, clockSkewMs: setup.skew_ms }),
  );
  const { race } = setup;
  const options = {
    owner: setup.owner,
    waitMs: setup.wait_ms,
    retryDelayMs: setup.retry_delay_ms,
    minLeaseMs: setup.min_lease_ms,
    ...(race.kind === 'elected' ? { termMs: race.term_ms, candidateTtlMs: race.heartbeat_ms * 3 } : {}),
  };
  const rules = new ElectionRules(JSON.stringify(options), table);
  try {
    switch (race.kind) {
      case 'leader':
        return rules.leaderMachine(race.key, seed, now);
      case 'slot':
        return rules.slotMachine(race.key, race.slots, seed, now);
      default: {
        // Core's spelling of a strategy ("HighestScore", { PreferredNode: id }) in JavaScript's.
        const s = race.strategy;
        const strategy = typeof s === 'string' ? s : { preferredNode: s.PreferredNode };
        return rules.electedMachine(race.key, JSON.stringify(strategy), seed, now);
      }
    }
  } finally {
    rules.free();
    table.free();
  }
}

/** A lease as core writes it, as JavaScript holds it (`Lease.toJSON()`). */
function jsLease(l) {
  return {
    id: l.id,
    owner: l.owner,
    fence: l.fence,
    expiresAtMs: l.expires_at_ms,
    lastSeq: l.last_seq,
    url: l.url,
    desiredState: l.desired_state,
    deadline: l.deadline_mono_ms,
  };
}

/** Feeds a trace's input as the elector does: by kind. */
function feed(machine, input, now) {
  switch (input.input) {
    case 'finished':
      return machine.finished(now);
    case 'abort':
      return machine.abort(now);
    default: {
      const { id, result } = input;
      if (result.Err !== undefined) {
        // Core's error (`{ kind, detail }`) as lib/errors.js gives one (`{ kind, ...fields }`).
        const { kind, detail } = result.Err;
        const fields = typeof detail === 'object' ? detail : detail === undefined ? {} : { message: detail };
        return machine.failed(id, JSON.stringify({ kind, ...fields }), now);
      }
      const ok = result.Ok;
      if (ok === 'done') {
        return machine.answered(id, now);
      }
      if (ok.lease) {
        return machine.answeredLease(id, JSON.stringify(jsLease(ok.lease)), now);
      }
      const listed = ok.candidates.map(({ expires_at_ms: expiresAtMs, ...c }) => ({ ...c, expiresAtMs }));
      return machine.answeredCandidates(id, JSON.stringify(listed), now);
    }
  }
}

/** Replays `trace`; returns the first step whose outputs differ, or null. */
function replay(trace) {
  const machine = machineOf(trace, trace.seed, trace.start_mono_ms);
  try {
    let failed = check(0, trace.start_expect, drain(() => machine.pollOutput()));
    for (let i = 0; !failed && i < trace.steps.length; i++) {
      const { at, input, expect } = trace.steps[i];
      if (input === undefined) {
        machine.handleTimeout(at);
      } else {
        feed(machine, input, at);
      }
      failed = check(i + 1, expect, drain(() => machine.pollOutput()));
    }
    return failed;
  } finally {
    machine.free();
  }
}

replayTests('elector', replay, { atLeast: 6, brokenAtLeast: 1 });

// A 2 s lease renewed every 500 ms, 200 ms of skew; the store's clock is the manual one plus STORE.
const STORE = 1_700_000_000_000;
const TIMING = { leaseMs: 2_000, renewMs: 500, clockSkewMs: 200 };

/** One lease key as the table keeps it: claims take it only past its expiry plus the skew. */
function oneKey() {
  let item = { owner: null, fence: 0, expiresAtMs: 0 };
  const lease = (now) => ({
    id: 'leader/job',
    owner: item.owner,
    fence: item.fence,
    expiresAtMs: item.expiresAtMs,
    lastSeq: null,
    url: null,
    desiredState: null,
    deadline: now + TIMING.leaseMs - TIMING.clockSkewMs,
  });
  return {
    claim(owner, now) {
      if (item.owner !== null && item.expiresAtMs >= STORE + now - TIMING.clockSkewMs) {
        return { held: item.owner };
      }
      item = { owner, fence: item.fence + 1, expiresAtMs: STORE + now + TIMING.leaseMs };
      return { lease: lease(now) };
    },
    renew(owner, now) {
      if (item.owner !== owner) {
        return { lost: true };
      }
      item.expiresAtMs = STORE + now + TIMING.leaseMs;
      return { lease: lease(now) };
    },
    release(owner) {
      if (item.owner === owner) {
        item = { ...item, owner: null, expiresAtMs: 0 };
      }
    },
  };
}

/**
 * Runs the calls `{ owner, options, work(now) }` of the elector on one key, 1 ms at a time from
 * 0 to `end`: each call's action returns `work` ms after it is elected (`abortAt`: the caller
 * aborts then). Returns each call's record: when it was elected, its term's end and outcome.
 */
function race(calls, end) {
  const store = oneKey();
  const table = new Table(JSON.stringify({ tableName: 'leases', ...TIMING }));
  const runs = calls.map((c, i) => {
    const rules = new ElectionRules(JSON.stringify({ owner: c.owner, ...c.options }), table);
    return { ...c, machine: rules.leaderMachine('leader/job', i + 1, c.start ?? 0), record: { over: [] } };
  });
  for (let now = 0; now <= end; now++) {
    for (const run of runs) {
      const { machine, record } = run;
      if (record.done) {
        continue;
      }
      if (run.abortAt === now) {
        machine.abort(now);
      }
      if (record.elected !== undefined && record.finished === undefined && now >= record.elected + run.work) {
        record.finished = now;
        machine.finished(now);
      }
      const at = machine.pollTimeout();
      if (at !== undefined && at <= now) {
        machine.handleTimeout(now);
      }
      for (let o = machine.pollOutput(); o !== undefined && !record.done; o = machine.pollOutput()) {
        const out = JSON.parse(o);
        if (out.output === 'send') {
          const kind = out.request.request;
          const answer =
            kind === 'claim' ? store.claim(run.owner, now) : kind === 'renew' ? store.renew(run.owner, now) : {};
          if (kind === 'release') {
            store.release(run.owner);
          }
          if (answer.lease) {
            machine.answeredLease(out.id, JSON.stringify(answer.lease), now);
          } else if (answer.held) {
            machine.failed(out.id, JSON.stringify({ kind: 'Held', owner: answer.held }), now);
          } else if (answer.lost) {
            machine.failed(out.id, JSON.stringify({ kind: 'Lost', id: 'leader/job' }), now);
          } else {
            machine.answered(out.id, now);
          }
        } else if (out.output === 'elected') {
          record.elected = now;
          record.fence = out.lease.fence;
        } else if (out.output === 'term_over') {
          record.over.push(out.reason);
        } else if (out.output === 'done') {
          record.done = { at: now, ...out.ended };
        }
      }
      if (record.done) {
        machine.free();
      }
    }
  }
  return runs.map((r) => r.record);
}

test('on a manual clock: a contender runs again only after the minimum lease, left to run out', () => {
  // election.test.mjs: a 10 ms job under a minimum lease longer than the lease, then `o2`
  // (6 s wait, 100 ms retry delay) contends; it must not run before the minimum lease.
  const [keep, other] = race(
    [
      { owner: 'k', options: { minLeaseMs: 2_500 }, work: 10 },
      { owner: 'o2', options: { waitMs: 6_000, retryDelayMs: 100 }, work: 10, start: 1 },
    ],
    6_000,
  );
  // k's first renewal (at 500) covers the minimum: nothing is released, the lease runs out.
  assert.deepEqual([keep.elected, keep.over, keep.done.outcome, keep.done.end], [0, ['Released'], 'led', 'Finished']);
  assert.equal(keep.done.at, 500);
  // Claimable once the expiry (2_500) is older than the clock minus the skew, taken within one
  // retry delay of that.
  assert.equal(other.fence, 2);
  assert.ok(other.elected > 2_700 && other.elected <= 2_800, `o2 elected at ${other.elected}`);
});

test("on a manual clock: the caller's abort ends the term, the lease is released and taken next", () => {
  const [a, b] = race(
    [
      { owner: 'abort-a', options: {}, work: 30, abortAt: 20 },
      { owner: 'abort-b', options: { waitMs: 3_000, retryDelayMs: 50 }, work: 5, start: 5 },
    ],
    3_000,
  );
  assert.deepEqual([a.over, a.done.outcome, a.done.end], [['Aborted'], 'led', 'Finished']);
  // The action returned at 30: released then, and `b` elected within one retry delay.
  assert.equal(a.done.at, 30);
  assert.ok(b.elected >= 30 && b.elected < 80, `b elected at ${b.elected}`);
  assert.deepEqual([b.fence, b.done.end], [2, 'Finished']);
});
