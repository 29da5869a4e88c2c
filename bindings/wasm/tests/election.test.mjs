// LeaderElector against the local engine: real contending processes (node:child_process), a
// shared holder counter under a lock file checked at every entry, and a Rust elector
// (`leaselock run-if-leader`) on the same name.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { LeaderElector, InvalidInputError } from '../index.mjs';

const require = createRequire(import.meta.url);
const { freshTable, eventually } = require('./helpers');
const { Shared } = require('./fixtures/shared');

const here = path.dirname(fileURLToPath(import.meta.url));
const contenderScript = path.join(here, 'fixtures', 'elector.js');
const cli = path.resolve(here, '../../../target/debug/leaselock');
const timing = { leaseMs: 1_500, renewMs: 400, clockSkewMs: 300 };
const retryDelayMs = 100;

let table;
const children = new Set();

before(async () => {
  table = await freshTable(timing);
});

after(() => {
  for (const child of children) {
    child.kill('SIGKILL');
  }
});

/** Starts one contender process with `role` (see fixtures/elector.js). */
function contender(shared, role) {
  const child = spawn(
    process.execPath,
    [contenderScript, JSON.stringify({ dir: shared.dir, tableName: table.tableName, ...timing, retryDelayMs, ...role })],
    { stdio: ['ignore', 'inherit', 'inherit'] },
  );
  children.add(child);
  child.exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
  child.exited.then(() => children.delete(child));
  return child;
}

async function joinAll(procs, ms) {
  const timer = setTimeout(() => procs.forEach((p) => p.kill('SIGKILL')), ms);
  const results = await Promise.all(procs.map((p) => p.exited));
  clearTimeout(timer);
  return results;
}

/** Ends contenders (SIGTERM: they exit at once, a lease they hold runs out). */
async function stopAll(procs) {
  procs.forEach((p) => p.kill('SIGTERM'));
  return joinAll(procs, 10_000);
}

/**
 * SIGKILLs a leader in its action, under the shared lock (so it cannot die holding it), and
 * takes it off the holders (it can no longer say it left). Returns when, in epoch ms.
 */
function killHolder(shared, child) {
  return shared.withState((s) => {
    child.kill('SIGKILL');
    s.holders = 0;
    return Date.now();
  });
}

function ofKind(events, kind) {
  return events.filter((e) => e.kind === kind);
}

function assertClean(shared) {
  const events = shared.events();
  assert.deepEqual(ofKind(events, 'violation'), [], 'no overlap, fences in order');
  assert.deepEqual(ofKind(events, 'error'), [], 'no errors');
  return events;
}

function waitForEvent(shared, what, ms, match) {
  return eventually(() => shared.events().find(match), ms, what);
}

describe('LeaderElector', () => {
  test('validates its options and arguments', async () => {
    assert.throws(() => new LeaderElector({ table, retryDelayMs: 0 }), InvalidInputError);
    assert.throws(() => new LeaderElector({ table, owner: '' }), (e) => e.field === 'owner');
    assert.throws(() => new LeaderElector({ table: {} }), (e) => e.field === 'table');
    const e = new LeaderElector({ table, owner: 'v', keyPrefix: 'app/' });
    assert.equal(e.leaderKey('nightly'), 'app/leader/nightly');
    await assert.rejects(e.runIfSlot('g', 0, async () => 1), (err) => err.field === 'slots');
    await assert.rejects(e.runIfElected('g', { score: 1 }, 'Best', async () => 1), (err) => err.field === 'strategy');
    await assert.rejects(e.runIfLeader('', async () => 1), (err) => err.field === 'name');
  });

  test('runs the action with the fence, skips a contender, keeps the minimum lease', async () => {
    const a = new LeaderElector({ table, owner: 'a' });
    const b = new LeaderElector({ table, owner: 'b' });
    const out = await a.runIfLeader('solo', async (term, signal) => {
      assert.equal(signal.aborted, false);
      assert.equal(term.key, 'leader/solo');
      const inner = await b.runIfLeader('solo', async () => assert.fail('b must not run'));
      return { fence: term.fence, inner };
    });
    assert.equal(out.led, true);
    assert.equal(out.end, 'Finished');
    assert.deepEqual(out.value, { fence: 1, inner: { led: false, skipped: true, holder: 'a' } });
    // Released: b leads next with the next fence; the key has no desired state.
    const next = await b.runIfLeader('solo', async (term) => term.fence);
    assert.equal(next.value, 2);
    const item = await table.get('leader/solo');
    assert.equal(item.desiredState, null);

    // A 10 ms job under a minimum lease longer than the lease: the lease is renewed until its
    // stored expiry covers the minimum, then left to run out; nobody else runs the job before.
    const keep = new LeaderElector({ table, owner: 'k', minLeaseMs: 2_500 });
    const claimed = performance.now();
    const ran = await keep.runIfLeader('min', async () => new Promise((resolve) => setTimeout(resolve, 10)));
    assert.equal(ran.led, true);
    const now = await new LeaderElector({ table, owner: 'o1' }).runIfLeader('min', async () => assert.fail('o1 ran'));
    assert.deepEqual(now, { led: false, skipped: true, holder: 'k' });
    const other = new LeaderElector({ table, owner: 'o2', waitMs: 6_000, retryDelayMs: 100 });
    const second = await other.runIfLeader('min', async () => performance.now());
    assert.equal(second.led, true);
    assert.ok(second.value - claimed >= 2_500, `ran again after ${second.value - claimed} ms`);
  });

  test('a lost lease aborts the signal before anyone else can lead', async () => {
    const a = new LeaderElector({ table, owner: 'lost-a' });
    const out = await a.runIfLeader('stolen', async (term, signal) => {
      // Someone rewrites the lease behind our back: the next renewal is refused.
      await table.client.send(
        new (require('@aws-sdk/client-dynamodb').UpdateItemCommand)({
          TableName: table.tableName,
          Key: { connection_id: { S: 'leader/stolen' } },
          UpdateExpression: 'SET lease_owner = :o ADD fence :one',
          ExpressionAttributeValues: { ':o': { S: 'thief' }, ':one': { N: '1' } },
        }),
      );
      if (!signal.aborted) {
        await new Promise((resolve) => signal.addEventListener('abort', resolve, { once: true }));
      }
      assert.ok(performance.now() < term.deadline, 'aborted before the deadline');
      return signal.reason.name;
    });
    assert.equal(out.end, 'Lost');
    assert.equal(out.value, 'LeaseLostError');
  });

  test("the caller's signal ends the action with its reason, and the lease is released", async () => {
    const caller = new AbortController();
    const elector = new LeaderElector({ table, owner: 'abort-a' });
    const out = await elector.runIfLeader(
      'abort',
      async (term, signal) => {
        setTimeout(() => caller.abort(new Error('enough')), 20);
        await new Promise((resolve) => signal.addEventListener('abort', resolve, { once: true }));
        return signal.reason.message;
      },
      { signal: caller.signal },
    );
    assert.deepEqual([out.value, out.end], ['enough', 'Finished']);
    const next = await new LeaderElector({ table, owner: 'abort-b' }).runIfLeader('abort', async (t) => t.fence);
    assert.equal(next.value, 2);
  });

  test('three processes over 200 terms never lead at once, fences strictly increase', async (t) => {
    const shared = Shared.create('terms');
    const procs = [0, 1, 2].map((i) =>
      contender(shared, { id: `p${i}`, name: 'terms', terms: 200, actionMs: 5, waitMs: 5_000, retryDelayMs: 150 }),
    );
    const results = await joinAll(procs, 60_000);
    assert.deepEqual(results.map((r) => r.code), [0, 0, 0]);
    const events = assertClean(shared);
    const enters = ofKind(events, 'enter');
    assert.ok(enters.length >= 200, `${enters.length} terms`);
    const fences = enters.map((e) => e.fence);
    assert.ok(fences.every((f, i) => i === 0 || fences[i - 1] < f), 'fences in order of entry');
    assert.ok(new Set(enters.map((e) => e.id)).size >= 2, 'more than one process led');
    t.diagnostic(`${enters.length} terms in ${enters.at(-1).t - enters[0].t} ms`);
    shared.remove();
  });

  test('a killed leader is replaced within lease + skew + retry delay', async (t) => {
    const shared = Shared.create('kill');
    const procs = new Map(
      [0, 1, 2].map((i) => [`k${i}`, contender(shared, { id: `k${i}`, name: 'kill', actionMs: 60_000, waitMs: 5_000 })]),
    );
    const first = await waitForEvent(shared, 'a first leader', 20_000, (e) => e.kind === 'enter');
    const killedAt = killHolder(shared, procs.get(first.id));
    const bound = timing.leaseMs + timing.clockSkewMs + retryDelayMs;
    const next = await waitForEvent(shared, 'a new leader', bound + 5_000, (e) => e.kind === 'enter' && e.t > killedAt);
    const took = next.t - killedAt;
    shared.stop();
    procs.delete(first.id);
    await stopAll([...procs.values()]);
    assertClean(shared);
    assert.notEqual(next.id, first.id);
    assert.ok(next.fence > first.fence);
    // Slack for the claim's own round trip on a loaded machine.
    assert.ok(took <= bound + 400, `replaced after ${took} ms; bound ${bound} ms`);
    t.diagnostic(`killed leader replaced after ${took} ms (lease + skew + retry = ${bound} ms)`);
    shared.remove();
  });

  test('two slots never have more than two holders under six contenders', async () => {
    const shared = Shared.create('group');
    const procs = [0, 1, 2, 3, 4, 5].map((i) =>
      contender(shared, { id: `g${i}`, mode: 'slot', name: 'group', slots: 2, terms: 40, actionMs: 40, waitMs: 5_000 }),
    );
    const results = await joinAll(procs, 60_000);
    assert.deepEqual(results.map((r) => r.code), [0, 0, 0, 0, 0, 0]);
    const events = assertClean(shared);
    const enters = ofKind(events, 'enter');
    assert.ok(enters.length >= 40, `${enters.length} terms`);
    assert.deepEqual([...new Set(enters.map((e) => e.key))].sort(), ['group/group#slot-0', 'group/group#slot-1']);
    // Both slots were held at once at some point (the limit was reached, not just respected).
    let holders = 0;
    let most = 0;
    for (const e of events) {
      holders += e.kind === 'enter' ? 1 : e.kind === 'leave' ? -1 : 0;
      most = Math.max(most, holders);
    }
    assert.equal(most, 2);
    shared.remove();
  });

  test('strategic: the highest score leads, the next takes over when it dies', async () => {
    const shared = Shared.create('strategic');
    const procs = new Map(
      [1, 2, 3].map((score) => [
        `c${score}`,
        contender(shared, { id: `c${score}`, mode: 'elected', name: 'strategic', score, actionMs: 60_000, waitMs: 5_000 }),
      ]),
    );
    // Whoever registered first may lead a term; the highest steps in at a term boundary.
    const top = await waitForEvent(shared, 'c3 leads', 20_000, (e) => e.kind === 'enter' && e.id === 'c3');
    // It holds leadership: nobody else enters for a few terms.
    await new Promise((resolve) => setTimeout(resolve, 2 * timing.leaseMs));
    assert.deepEqual(
      ofKind(shared.events(), 'enter').filter((e) => e.t > top.t),
      [],
      'the highest candidate keeps leading',
    );
    const killedAt = killHolder(shared, procs.get('c3'));
    const next = await waitForEvent(shared, 'a new leader', 15_000, (e) => e.kind === 'enter' && e.t > killedAt);
    assert.equal(next.id, 'c2', 'the next best candidate takes over');
    assert.ok(next.fence > top.fence);
    shared.stop();
    procs.delete('c3');
    await stopAll([...procs.values()]);
    assertClean(shared);
    shared.remove();
  });

  test('a Node elector and the Rust elector on one name never lead at once', { skip: !existsSync(cli) && 'cargo build -p leaselock-cli first' }, async () => {
    const shared = Shared.create('mixed');
    const node = [0, 1].map((i) =>
      contender(shared, { id: `node${i}`, name: 'mixed', actionMs: 30, waitMs: 3_000, pauseMs: 150 }),
    );
    // On DynamoDB, not on the Redis store LEASELOCK_REDIS_URL would select.
    const rustEnv = (id) => {
      const { LEASELOCK_REDIS_URL: _, ...env } = process.env;
      return { ...env, SHARED_DIR: shared.dir, TERM_ID: id, TERM_MS: '30' };
    };
    const rustRuns = async (id, runs) => {
      let led = 0;
      for (let i = 0; i < runs; i += 1) {
        const child = spawn(
          cli,
          [
            '--table', table.tableName,
            '--lease-ms', String(timing.leaseMs),
            '--renew-ms', String(timing.renewMs),
            '--clock-skew-ms', String(timing.clockSkewMs),
            'run-if-leader', 'mixed', '--wait-ms', '1000', '--retry-delay-ms', String(retryDelayMs), '--owner', `${id}-${i}`,
            '--', process.execPath, contenderScript, 'term',
          ],
          { stdio: ['ignore', 'ignore', 'pipe'], env: rustEnv(id) },
        );
        children.add(child);
        let stderr = '';
        child.stderr.on('data', (chunk) => {
          stderr += chunk;
        });
        const code = await new Promise((resolve) => child.on('close', (c) => resolve(c)));
        children.delete(child);
        if (code === 0) {
          led += 1;
        } else {
          assert.match(stderr, /^skipped: mixed is led by /, `run-if-leader exited ${code}: ${stderr}`);
        }
      }
      return led;
    };
    const led = await Promise.all([rustRuns('rust0', 4), rustRuns('rust1', 4)]);
    await stopAll(node);
    const events = assertClean(shared);
    const enters = ofKind(events, 'enter');
    assert.ok(led[0] + led[1] > 0, 'the Rust elector led');
    assert.ok(enters.some((e) => e.id.startsWith('node')), 'a Node elector led');
    const fences = enters.map((e) => e.fence);
    assert.ok(fences.every((f, i) => i === 0 || fences[i - 1] < f), `fences in order of entry: ${fences}`);
    shared.remove();
  });
});
