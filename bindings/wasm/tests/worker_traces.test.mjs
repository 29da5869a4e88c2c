// The worker trace vectors (tests/conformance/worker/*.json, format in tests/conformance/README.md)
// replayed through the package's binding of the worker engine: the same events in at the same
// times must give the same commands out, in order. The vectors in broken/ must not replay.
import test from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { join, dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const { WorkerEngine } = require('../pkg/leaselock_wasm.js');

const here = dirname(fileURLToPath(import.meta.url));
const dir = resolve(here, '..', '..', '..', 'tests', 'conformance', 'worker');

function vectors(folder) {
  return readdirSync(folder)
    .filter((f) => f.endsWith('.json'))
    .sort()
    .map((f) => ({ file: f, trace: JSON.parse(readFileSync(join(folder, f), 'utf8')) }));
}

function drain(engine) {
  const out = [];
  for (let c = engine.poll_command(); c !== undefined; c = engine.poll_command()) {
    out.push(JSON.parse(c));
  }
  return out;
}

/** Replays `trace`; returns the first step whose commands differ, or null. */
function replay(trace) {
  const engine = WorkerEngine.with_timing(
    JSON.stringify(trace.timing),
    JSON.stringify(trace.settings),
    trace.seed,
    trace.start.wall_ms,
    trace.start.mono_ms,
  );
  const check = (step, expected, got) => {
    try {
      assert.deepStrictEqual(got, expected);
      return null;
    } catch (e) {
      return { step, message: e.message };
    }
  };
  let failed = check(0, trace.start_expect, drain(engine));
  for (let i = 0; !failed && i < trace.steps.length; i++) {
    const { at, event, expect } = trace.steps[i];
    if (event === undefined) {
      engine.handleTimeout(at.wall_ms, at.mono_ms);
    } else {
      engine.handle(JSON.stringify(event), at.wall_ms, at.mono_ms);
    }
    failed = check(i + 1, expect, drain(engine));
  }
  engine.free();
  return failed;
}

const good = vectors(dir);
test('there are worker trace vectors to replay', () => {
  assert.ok(good.length >= 2, `${good.length} vectors in ${dir}`);
});

for (const { file, trace } of good) {
  test(`worker trace ${trace.name} replays`, () => {
    const failed = replay(trace);
    assert.equal(failed, null, failed && `${file} step ${failed.step}: ${failed.message}`);
  });
}

for (const { file, trace } of vectors(join(dir, 'broken'))) {
  test(`broken worker trace ${trace.name} does not replay`, () => {
    assert.notEqual(replay(trace), null, `${file} replayed although broken`);
  });
}
