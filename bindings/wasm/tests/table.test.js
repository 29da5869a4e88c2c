'use strict';
// LeaseTable against the local engine: races, takeover, stale owners, checkpoints, orphans,
// the using() scope and bad input.
const test = require('node:test');
const assert = require('node:assert/strict');
const { performance } = require('node:perf_hooks');
const { LeaseTable, LeaseHeldError, LeaseLostError, LeaseNotFoundError, SeqNotIncreasingError, InvalidInputError } = require('..');
const { DeleteTableCommand } = require('@aws-sdk/client-dynamodb');
const { freshTable, rawItem, putRaw, eventually } = require('./helpers');

// Leases short enough for a takeover within a test, long enough for the engine's pace.
const FAST = { leaseMs: 2_000, renewMs: 400, clockSkewMs: 300 };

test('16 concurrent claimers over 50 rounds: exactly one winner per round', async () => {
  const table = await freshTable();
  for (let round = 0; round < 50; round++) {
    const id = `race-${round}`;
    const owners = Array.from({ length: 16 }, (_, i) => `claimer-${i}`);
    const results = await Promise.allSettled(owners.map((owner) => table.acquire(id, { owner })));
    const won = results.filter((r) => r.status === 'fulfilled');
    assert.equal(won.length, 1, `round ${round}: ${won.length} winners`);
    const winner = won[0].value;
    assert.equal(winner.fence, 1);
    for (const r of results.filter((r) => r.status === 'rejected')) {
      assert.ok(r.reason instanceof LeaseHeldError, `${r.reason}`);
      assert.equal(r.reason.owner, winner.owner);
      assert.equal(r.reason.expiresAtMs, winner.expiresAtMs);
    }
    const item = await table.get(id);
    assert.deepEqual([item.owner, item.fence], [winner.owner, 1]);
  }
});

test('takeover only after expiry + skew, with fence + 1; the stale owner changes nothing', async () => {
  const table = await freshTable(FAST);
  await table.start('s1', 'ws://127.0.0.1:9/s1');
  const a = await table.acquire('s1', { owner: 'a' });
  assert.equal(a.fence, 1);
  await a.checkpoint(7);
  // Before expiry + skew by B's clock every claim is refused and names A.
  const early = await table.acquire('s1', { owner: 'b' }).catch((e) => e);
  assert.ok(early instanceof LeaseHeldError);
  assert.deepEqual([early.owner, early.expiresAtMs], ['a', a.expiresAtMs]);
  await eventually(() => Date.now() > a.expiresAtMs + table.clockSkewMs, 5_000, 'expiry + skew');
  const b = await table.acquire('s1', { owner: 'b' });
  assert.ok(Date.now() > a.expiresAtMs + table.clockSkewMs);
  assert.deepEqual([b.fence, b.lastSeq, b.owner], [2, 7, 'b']);
  // A's deadline passed before B could claim (rule 2 with rule 1).
  assert.ok(performance.now() > a.deadline);
  const before = await rawItem(table, 's1');
  await assert.rejects(a.renew(), LeaseLostError);
  await assert.rejects(a.checkpoint(8), LeaseLostError);
  await assert.rejects(a.release(), LeaseLostError);
  assert.deepEqual(await rawItem(table, 's1'), before);
});

test('deadline is the performance.now() instant lease - skew after the claim was sent; timeLeft() counts down to it', async () => {
  // The instant Rust's Lease::deadline() and Python's lease.deadline name on their own
  // monotonic clocks (core/tests/deadline.rs, test_lease.py).
  const table = await freshTable(FAST);
  const window = table.leaseMs - table.clockSkewMs;
  const [before, wallBefore] = [performance.now(), Date.now()];
  const lease = await table.acquire('deadline', { owner: 'a' });
  const after = performance.now();
  // Core counts whole milliseconds: up to 1 ms early, never late.
  assert.ok(lease.deadline >= before + window - 1, `${lease.deadline - before} of ${window}`);
  assert.ok(lease.deadline <= after + window, `${lease.deadline - after} of ${window}`);
  // The stored expiry is on the (store's) wall clock, a lease after the same send.
  assert.ok(lease.expiresAtMs >= wallBefore + table.leaseMs - 1_000, `${lease.expiresAtMs - wallBefore}`);
  const t0 = performance.now();
  const left = lease.timeLeft();
  const t1 = performance.now();
  assert.ok(left <= lease.deadline - t0 && left >= lease.deadline - t1, `${left}`);
  // A renewal (sent after the claim's answer came back) moves it later.
  const first = lease.deadline;
  await lease.renew();
  assert.ok(lease.deadline > first);
  // Past the deadline the time left is 0, never negative.
  await eventually(() => performance.now() > lease.deadline, window + 1_000, 'the deadline');
  assert.equal(lease.timeLeft(), 0);

  // A session's deadline means the same, and is its leases' until the session ends.
  const sessions = await freshTable({ ...FAST, mode: 'session' });
  await sessions.start('s1', 'ws://127.0.0.1:9/s1');
  const sentAt = performance.now();
  const session = await sessions.createSession('w1');
  const answered = performance.now();
  assert.ok(session.deadline >= sentAt + window - 1 && session.deadline <= answered + window, `${session.deadline - sentAt}`);
  const underSession = await session.claim('s1');
  assert.equal(underSession.deadline, session.deadline);
  const [s0, sessionLeft, s1] = [performance.now(), session.timeLeft(), performance.now()];
  assert.ok(sessionLeft <= session.deadline - s0 && sessionLeft >= session.deadline - s1, `${sessionLeft}`);
  await session.end();
  assert.equal(underSession.timeLeft(), 0, 'an ended session leaves its leases no time');
});

test("a stale owner within its deadline is refused by the store's condition, and changes nothing", async () => {
  const table = await freshTable();
  const a = await table.acquire('k', { owner: 'a' });
  await a.checkpoint(3);
  // The item is rewritten behind A's back while A's deadline is still far away.
  const taken = { ...(await rawItem(table, 'k')), lease_owner: { S: 'intruder' }, fence: { N: '2' } };
  await putRaw(table, taken);
  assert.ok(performance.now() < a.deadline);
  await assert.rejects(a.renew(), LeaseLostError);
  await assert.rejects(a.checkpoint(4), LeaseLostError);
  await assert.rejects(a.release(), LeaseLostError);
  const put = { Put: { TableName: table.tableName, Item: { connection_id: { S: 'written-by-a' } } } };
  await assert.rejects(a.write([put]), LeaseLostError);
  assert.deepEqual(await rawItem(table, 'k'), taken);
  assert.equal(await rawItem(table, 'written-by-a'), undefined);
});

test('checkpoints only move forward', async () => {
  const table = await freshTable();
  const lease = await table.acquire('c', { owner: 'w' });
  assert.equal(lease.lastSeq, null);
  await lease.checkpoint(5);
  assert.equal(lease.lastSeq, 5);
  for (const seq of [5, 3]) {
    const e = await lease.checkpoint(seq).catch((err) => err);
    assert.ok(e instanceof SeqNotIncreasingError, `${e}`);
    assert.deepEqual([e.lastSeq, e.seq], [5, seq]);
  }
  await lease.checkpoint(6);
  await lease.renew();
  assert.equal((await table.get('c')).lastSeq, 6);
  assert.equal(lease.lastSeq, 6);
  await assert.rejects(lease.checkpoint(-1), (e) => e instanceof InvalidInputError && e.field === 'seq');
});

test('a sharded orphan index: STARTED#k written, orphans listed from every shard, bad counts refused', async () => {
  const table = await freshTable({ orphanShards: 8 });
  assert.equal(table.orphanShards, 8);
  const ids = Array.from({ length: 40 }, (_, i) => `s${String(i).padStart(2, '0')}`);
  await Promise.all(ids.map((id) => table.start(id, `ws://127.0.0.1:9/${id}`)));
  const values = new Set();
  for (const id of ids) values.add((await rawItem(table, id)).desired_state.S);
  assert.deepEqual([...values].sort(), Array.from({ length: 8 }, (_, k) => `STARTED#${k}`).sort());
  assert.equal((await table.get(ids[0])).desiredState, 'STARTED');
  await table.acquireStarted(ids[0], { owner: 'w' });
  const left = await table.orphans({ pageSize: 3 });
  assert.deepEqual(left.map((i) => i.id).sort(), ids.slice(1));
  assert.equal((await table.orphans({ limit: 5, pageSize: 2 })).length, 5);
  for (const bad of [0, 257, 1.5]) {
    assert.throws(() => new LeaseTable({ client: table.client, tableName: 'leases', orphanShards: bad }),
      (e) => e instanceof InvalidInputError && e.field === 'orphanShards', `${bad}`);
  }
});

test('orphans over 260 items, across pages, oldest first; claimed ones leave the list', async () => {
  const table = await freshTable({ keyPrefix: 'app/' });
  const ids = Array.from({ length: 260 }, (_, i) => `o-${String(i).padStart(3, '0')}`);
  for (let i = 0; i < ids.length; i += 20) {
    await Promise.all(ids.slice(i, i + 20).map((id) => table.start(id, `ws://127.0.0.1:9/${id}`)));
  }
  const all = await table.orphans({ pageSize: 100 });
  assert.deepEqual(all.map((i) => i.id).sort(), ids);
  assert.ok(all.every((i) => i.desiredState === 'STARTED' && i.expiresAtMs === 0 && i.url.endsWith(i.id)));
  assert.equal((await table.orphans({ limit: 120, pageSize: 50 })).length, 120);
  const claimed = await Promise.all(ids.slice(0, 10).map((id) => table.acquireStarted(id, { owner: 'w' })));
  const left = await table.orphans();
  assert.equal(left.length, 250);
  assert.ok(!left.some((i) => ids.slice(0, 10).includes(i.id)));
  // Released work is an orphan again at once; stopped work never is.
  await claimed[0].release();
  await table.stop(ids[1]);
  const after = (await table.orphans()).map((i) => i.id);
  assert.ok(after.includes(ids[0]) && !after.includes(ids[1]));
  const owned = await table.ownedBy('w');
  assert.deepEqual(owned.map((i) => i.id).sort(), ids.slice(1, 10));
  const states = await table.desiredStates([ids[0], ids[1], 'never-started']);
  assert.deepEqual([states.size, states.get(ids[0]), states.get(ids[1]), states.get('never-started')], [3, 'STARTED', 'STOPPED', null]);
});

test('fleet claims take only STARTED work; stop of a missing id is NotFound', async () => {
  const table = await freshTable();
  await assert.rejects(table.acquireStarted('nothing', { owner: 'w' }), LeaseNotFoundError);
  await assert.rejects(table.stop('nothing'), LeaseNotFoundError);
  await table.start('s', 'ws://127.0.0.1:9/s');
  await table.stop('s');
  await assert.rejects(table.acquireStarted('s', { owner: 'w' }), (e) => e.name === 'LeaseStoppedError');
  assert.equal(await table.get('nothing'), null);
  assert.equal((await table.items()).length, 1);
});

test('bad input writes nothing to the table', async () => {
  const table = await freshTable();
  const lease = await table.acquire('x', { owner: 'w' });
  const before = await table.items();
  const invalid = (field) => (e) => e instanceof InvalidInputError && e.field === field;
  await assert.rejects(table.start('', 'ws://h/x'), invalid('id'));
  await assert.rejects(table.start('y', 'not-a-url'), invalid('url'));
  await assert.rejects(table.acquire('y', { owner: '' }), invalid('owner'));
  await assert.rejects(lease.checkpoint(1.5), invalid('seq'));
  await assert.rejects(lease.write(new Array(100).fill({ ConditionCheck: {} })), invalid('writes'));
  assert.deepEqual(await table.items(), before);
});

test('using(): claims, renews on schedule, releases after the routine, resolves its result', async () => {
  const table = await freshTable(FAST);
  const result = await table.using('job', { owner: 'w' }, async (lease, signal) => {
    const fence = lease.fence;
    const firstExpiry = lease.expiresAtMs;
    // Three renew intervals: the background renewals move the expiry forward.
    await new Promise((resolve) => setTimeout(resolve, 3 * table.renewMs + 200));
    assert.ok(lease.expiresAtMs > firstExpiry, 'renewed in the background');
    assert.equal(signal.aborted, false);
    return fence;
  });
  assert.equal(result, 1);
  const item = await table.get('job');
  assert.deepEqual([item.owner, item.expiresAtMs], ['w', 0]);
});

test("using(): the signal aborts before the deadline when the lease is taken behind the routine's back", { timeout: 30_000 }, async () => {
  const table = await freshTable(FAST);
  const seen = await table.using('job', { owner: 'w' }, async (lease, signal) => {
    const item = await rawItem(table, 'job');
    await putRaw(table, { ...item, lease_owner: { S: 'intruder' }, fence: { N: String(lease.fence + 1) } });
    await new Promise((resolve) => signal.addEventListener('abort', resolve, { once: true }));
    return { reason: signal.reason, at: performance.now(), deadline: lease.deadline };
  });
  assert.ok(seen.reason instanceof LeaseLostError);
  assert.equal(seen.reason.reason, 'Lost');
  assert.ok(seen.at < seen.deadline, 'aborted before the deadline');
  // Not released: the item is the intruder's.
  assert.equal((await table.get('job')).owner, 'intruder');
});

test("using(): released after STOP and when the routine throws; no request when the routine released it or it was lost (as Python's hold())", { timeout: 30_000 }, async () => {
  const table = await freshTable(FAST);
  await assert.rejects(table.using('threw', { owner: 'w' }, async () => {
    throw new Error('the routine failed');
  }), /the routine failed/);
  assert.equal((await table.get('threw')).expiresAtMs, 0);
  await table.start('stopped', 'wss://feed.example/s');
  await table.using('stopped', { owner: 'w' }, async (lease, signal) => {
    await table.stop('stopped');
    await new Promise((resolve) => signal.addEventListener('abort', resolve, { once: true }));
    assert.equal(signal.reason.reason, 'Stopped');
  });
  assert.equal((await table.get('stopped')).expiresAtMs, 0);
  // Each table is deleted inside the routine: a release sent at the exit would fail.
  const gone = (t) => t.client.send(new DeleteTableCommand({ TableName: t.tableName }));
  await table.using('released', { owner: 'w' }, async (lease) => {
    await lease.release();
    await gone(table);
  });
  const other = await freshTable(FAST);
  await other.using('lost', { owner: 'w' }, async (lease, signal) => {
    const item = await rawItem(other, 'lost');
    await putRaw(other, { ...item, lease_owner: { S: 'intruder' }, fence: { N: String(lease.fence + 1) } });
    await new Promise((resolve) => signal.addEventListener('abort', resolve, { once: true }));
    assert.equal(signal.reason.reason, 'Lost');
    await gone(other);
  });
});

test('Symbol.asyncDispose releases the lease', async () => {
  const table = await freshTable();
  const lease = await table.acquire('d', { owner: 'w' });
  await lease[Symbol.asyncDispose]();
  assert.equal((await table.get('d')).expiresAtMs, 0);
  const next = await table.acquire('d', { owner: 'v' });
  assert.equal(next.fence, 2);
  await lease[Symbol.asyncDispose]();
  assert.equal((await table.get('d')).owner, 'v');
});

test('an aborted signal rejects with its reason', async () => {
  const table = await freshTable();
  const controller = new AbortController();
  controller.abort(new Error('stop here'));
  await assert.rejects(table.get('a', { signal: controller.signal }), /stop here/);
});

test("every answer measures the store's clock; measureClock narrows it with a few timed requests", async () => {
  const table = await freshTable();
  // createTable and checkTable answered: measured, a second or so wide.
  const first = table.clockEstimate();
  assert.ok(first !== undefined && first.samples >= 1, JSON.stringify(first));
  const measured = await table.measureClock({ withinMs: 25 });
  // The local engine runs on this host's clock: the true offset is 0.
  assert.ok(measured.uncertaintyMs <= 25, JSON.stringify(measured));
  assert.ok(Math.abs(measured.offsetMs) <= measured.uncertaintyMs + 2, JSON.stringify(measured));
  assert.ok(Math.abs(table.clock.now() - Date.now()) <= 2 * measured.uncertaintyMs + 5);
});
