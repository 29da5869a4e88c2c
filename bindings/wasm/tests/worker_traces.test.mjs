// The worker trace vectors (tests/conformance/worker/*.json, format in tests/conformance/README.md)
// replayed through the package's binding of the worker engine: the same events in at the same
// times must give the same commands out, in order. The vectors in broken/ must not replay.
import { createRequire } from 'node:module';
import { check, drain, replayTests } from './vectors.mjs';

const require = createRequire(import.meta.url);
const { WorkerEngine } = require('../pkg/leaselock_wasm.js');

/** Replays `trace`; returns the first step whose commands differ, or null. */
function replay(trace) {
  const engine = WorkerEngine.with_timing(
    JSON.stringify(trace.timing),
    JSON.stringify(trace.settings),
    trace.seed,
    trace.start.wall_ms,
    trace.start.mono_ms,
  );
  let failed = check(0, trace.start_expect, drain(() => engine.poll_command()));
  for (let i = 0; !failed && i < trace.steps.length; i++) {
    const { at, event, expect } = trace.steps[i];
    if (event === undefined) {
      engine.handleTimeout(at.wall_ms, at.mono_ms);
    } else {
      engine.handle(JSON.stringify(event), at.wall_ms, at.mono_ms);
    }
    failed = check(i + 1, expect, drain(() => engine.poll_command()));
  }
  engine.free();
  return failed;
}

replayTests('worker', replay, { atLeast: 2 });
