// What the trace-vector runners share (worker_traces, elector_traces, holder_traces): the vectors
// of one folder of tests/conformance, a machine's outputs drained, a step's check, and the tests
// themselves: every vector replays, and every vector in broken/ does not.
import test from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { join, dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const conformance = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..', '..', 'tests', 'conformance');

function vectors(folder) {
  return readdirSync(folder)
    .filter((f) => f.endsWith('.json'))
    .sort()
    .map((f) => ({ file: f, trace: JSON.parse(readFileSync(join(folder, f), 'utf8')) }));
}

/** Every output `next()` gives (a JSON string each) until it gives `undefined`, parsed. */
export function drain(next) {
  const out = [];
  for (let o = next(); o !== undefined; o = next()) {
    out.push(JSON.parse(o));
  }
  return out;
}

/** `null` when step `step` gave what its trace expects, else where and how it parted. */
export function check(step, expected, got) {
  try {
    assert.deepStrictEqual(got, expected);
    return null;
  } catch (e) {
    return { step, message: e.message };
  }
}

/**
 * The tests of the `kind` vectors (tests/conformance/<kind>): at least `atLeast` of them, each
 * replayed by `replay(trace)` (the first failed check, or null); the broken ones (at least
 * `brokenAtLeast`, when given) must not replay.
 */
export function replayTests(kind, replay, { atLeast, brokenAtLeast }) {
  const dir = join(conformance, kind);
  const good = vectors(dir);
  test(`there are ${kind} trace vectors to replay`, () => {
    assert.ok(good.length >= atLeast, `${good.length} vectors in ${dir}`);
  });
  for (const { file, trace } of good) {
    test(`${kind} trace ${trace.name} replays`, () => {
      const failed = replay(trace);
      assert.equal(failed, null, failed && `${file} step ${failed.step}: ${failed.message}`);
    });
  }
  const broken = vectors(join(dir, 'broken'));
  if (brokenAtLeast !== undefined) {
    test(`there are broken ${kind} trace vectors`, () => {
      assert.ok(broken.length >= brokenAtLeast);
    });
  }
  for (const { file, trace } of broken) {
    test(`broken ${kind} trace ${trace.name} does not replay`, () => {
      assert.notEqual(replay(trace), null, `${file} replayed although broken`);
    });
  }
}
