// The elector trace vectors (tests/conformance/elector/*.json, format in
// tests/conformance/README.md) replayed through the package's binding of the election machine:
// the same inputs at the same times must give the same outputs, in order. The vectors in broken/
// must not replay.
import test from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { join, dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const { ElectorMachine } = require('../pkg/leaselock_wasm.js');

const here = dirname(fileURLToPath(import.meta.url));
const dir = resolve(here, '..', '..', '..', 'tests', 'conformance', 'elector');

function vectors(folder) {
  return readdirSync(folder)
    .filter((f) => f.endsWith('.json'))
    .sort()
    .map((f) => ({ file: f, trace: JSON.parse(readFileSync(join(folder, f), 'utf8')) }));
}

function drain(machine) {
  const out = [];
  for (let o = machine.pollOutput(); o !== undefined; o = machine.pollOutput()) {
    out.push(JSON.parse(o));
  }
  return out;
}

/** Replays `trace`; returns the first step whose outputs differ, or null. */
function replay(trace) {
  const machine = ElectorMachine.fromSetup(JSON.stringify(trace.setup), trace.seed, trace.start_mono_ms);
  const check = (step, expected, got) => {
    try {
      assert.deepStrictEqual(got, expected);
      return null;
    } catch (e) {
      return { step, message: e.message };
    }
  };
  try {
    let failed = check(0, trace.start_expect, drain(machine));
    for (let i = 0; !failed && i < trace.steps.length; i++) {
      const { at, input, expect } = trace.steps[i];
      if (input === undefined) {
        machine.handleTimeout(at);
      } else {
        machine.handle(JSON.stringify(input), at);
      }
      failed = check(i + 1, expect, drain(machine));
    }
    return failed;
  } finally {
    machine.free();
  }
}

const good = vectors(dir);
test('there are elector trace vectors to replay', () => {
  assert.ok(good.length >= 6, `${good.length} vectors in ${dir}`);
});

for (const { file, trace } of good) {
  test(`elector trace ${trace.name} replays`, () => {
    const failed = replay(trace);
    assert.equal(failed, null, failed && `${file} step ${failed.step}: ${failed.message}`);
  });
}

const broken = vectors(join(dir, 'broken'));
test('there are broken elector trace vectors', () => {
  assert.ok(broken.length >= 1);
});

for (const { file, trace } of broken) {
  test(`broken elector trace ${trace.name} does not replay`, () => {
    assert.notEqual(replay(trace), null, `${file} replayed although broken`);
  });
}
