// The holder trace vectors (tests/conformance/holder/*.json, format in
// tests/conformance/README.md) replayed through the package's binding of the holder machine
// (HolderMachine), made as keeper.js and a session's leases make it (from a table's timing) and
// fed through the drivers' own calls: the same inputs at the same times must give the same
// outputs, in order, and the same answer to mayAct. The vectors in broken/ must not replay.
import { createRequire } from 'node:module';
import { check, drain, replayTests } from './vectors.mjs';

const require = createRequire(import.meta.url);
const { HolderMachine, Table } = require('../pkg/leaselock_wasm.js');

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

/** A trace's machine, made as the drivers make one: from a table's timing. */
function machineOf(trace) {
  const { setup } = trace;
  const table = new Table(
    JSON.stringify({ tableName: 'leases', leaseMs: setup.lease_ms, renewMs: setup.renew_ms, clockSkewMs: setup.skew_ms }),
  );
  try {
    return new HolderMachine(table, JSON.stringify(jsLease(trace.lease)), setup.mode, trace.seed, trace.start_mono_ms);
  } finally {
    table.free();
  }
}

/** Feeds a trace's input as the drivers do: by kind. */
function feed(machine, input, now) {
  switch (input.input) {
    case 'cover':
      return machine.cover(input.deadline_mono_ms, now);
    case 'session_lost':
      return machine.sessionLost(now);
    case 'session_ended':
      return machine.sessionEnded(now);
    case 'cancel':
      return machine.cancel(input.reason, now);
    default: {
      const { id, result } = input;
      if (result.Err !== undefined) {
        // Core's error (`{ kind, detail }`) as lib/errors.js gives one (`{ kind, ...fields }`).
        const { kind, detail } = result.Err;
        const fields = typeof detail === 'object' ? detail : detail === undefined ? {} : { message: detail };
        return machine.failed(id, JSON.stringify({ kind, ...fields }), now);
      }
      return machine.renewed(id, JSON.stringify(jsLease(result.Ok)), now);
    }
  }
}

/** Replays `trace`; returns the first step whose outputs (or mayAct) differ, or null. */
function replay(trace) {
  const machine = machineOf(trace);
  try {
    let failed = check(0, trace.start_expect, drain(() => machine.pollOutput()));
    for (let i = 0; !failed && i < trace.steps.length; i++) {
      const { at, input, expect, may_act: mayAct } = trace.steps[i];
      if (input === undefined) {
        machine.handleTimeout(at);
      } else {
        feed(machine, input, at);
      }
      failed = check(i + 1, [...expect, { may_act: mayAct }], [...drain(() => machine.pollOutput()), { may_act: machine.mayAct(at) }]);
    }
    return failed;
  } finally {
    machine.free();
  }
}

replayTests('holder', replay, { atLeast: 7, brokenAtLeast: 1 });
