// Session mode from Node against the local engine: claims under a session, a live session's
// work refused, the takeover of a dead session's work (one transaction, fence + 1) and what the
// stale session may still do (nothing), the one-write end, a session lease's signal (the claim's
// signal, the session's loss or end, its deadline), and the Worker's session loop.
import test from 'node:test';
import assert from 'node:assert/strict';
import { performance } from 'node:perf_hooks';
import { SQSClient, CreateQueueCommand, GetQueueAttributesCommand, SendMessageCommand, ReceiveMessageCommand } from '@aws-sdk/client-sqs';
import leaselock from '../index.js';
import helpers from './helpers.js';

const { Worker, LeaseHeldError, LeaseLostError, InvalidInputError } = leaselock;
const { client, freshTable, rawItem, putRaw, eventually } = helpers;

const FAST = { mode: 'session', leaseMs: 3_000, renewMs: 300, clockSkewMs: 300 };
const LIMIT = { timeout: 60_000 };
const quiet = { warn() {} };

/** A DynamoDBClient whose requests are counted by operation (a middleware before sending). */
function countingClient() {
  const sdk = client();
  const counts = new Map();
  const log = [];
  sdk.middlewareStack.add(
    (next, context) => (args) => {
      counts.set(context.commandName, (counts.get(context.commandName) ?? 0) + 1);
      // A release or a session end sets the expiry to zero (a renewal also names :zero, in its
      // condition: a released lease is not renewed).
      const zero = /#exp = :zero\b/.test(args.input.UpdateExpression ?? '');
      log.push({ command: context.commandName, id: args.input.Key?.connection_id?.S, zero });
      return next(args);
    },
    { step: 'initialize', name: 'countRequests' },
  );
  return { sdk, counts, log, total: () => log.length };
}

async function startAll(table, ids) {
  await Promise.all(ids.map((id) => table.start(id, `ws://127.0.0.1:9/${id}`)));
}

const sessionItem = (table, owner) => rawItem(table, `session/${owner}`);

test('a claim under a session: owner, epoch, fence + 1, the sentinel expiry and the session deadline', LIMIT, async () => {
  const table = await freshTable(FAST);
  assert.equal(table.mode, 'session');
  await startAll(table, ['a', 'b']);
  const session = await table.createSession('w1');
  assert.equal(session.owner, 'w1');
  assert.ok(session.epoch >= 1);
  assert.ok(session.expiresAtMs > Date.now());
  assert.ok(session.deadline > performance.now() && session.deadline <= performance.now() + FAST.leaseMs);
  const lease = await session.claim('a');
  assert.equal(lease.owner, 'w1');
  assert.equal(lease.fence, 1);
  assert.equal(lease.deadline, session.deadline);
  assert.equal(lease.session, session);
  const raw = await rawItem(table, 'a');
  assert.equal(raw.session_epoch.N, String(session.epoch));
  assert.ok(Number(raw.lease_expires_at_ms.N) > Date.now() + 365 * 24 * 3600 * 1000, 'the held sentinel');
  // Checkpoints go through the lease as for any lease; a renewal moves every lease's deadline.
  await lease.checkpoint(5);
  assert.equal((await rawItem(table, 'a')).last_seq.N, '5');
  const before = lease.deadline;
  await new Promise((resolve) => setTimeout(resolve, 20));
  await session.renew();
  assert.ok(lease.deadline > before && lease.deadline === session.deadline);
  const sessions = await table.sessions();
  assert.deepEqual(
    sessions.map((s) => [s.owner, s.epoch]),
    [['w1', session.epoch]],
  );
  // A per-item table refuses sessions, naming the option.
  const plain = await freshTable({});
  await assert.rejects(plain.createSession('w1'), (e) => e instanceof InvalidInputError && e.field === 'mode');
});

test("another live session's work is refused with LeaseHeldError", LIMIT, async () => {
  const table = await freshTable(FAST);
  await startAll(table, ['a']);
  const one = await table.createSession('w1');
  await one.claim('a');
  const two = await table.createSession('w2');
  await assert.rejects(two.claim('a'), (e) => e instanceof LeaseHeldError && e.owner === 'w1');
  const raw = await rawItem(table, 'a');
  assert.equal(raw.lease_owner.S, 'w1');
  assert.equal(raw.fence.N, '1');
});

test("a dead session's work is taken over after expiry + skew with fence + 1; the stale session changes nothing", LIMIT, async () => {
  const table = await freshTable(FAST);
  await startAll(table, ['a']);
  const stale = await table.createSession('w1');
  const old = await stale.claim('a');
  await old.checkpoint(3);
  const staleItem = await sessionItem(table, 'w1');
  const counting = countingClient();
  const { LeaseTable } = leaselock;
  const other = new LeaseTable({ ...FAST, client: counting.sdk, tableName: table.tableName });
  const fresh = await other.createSession('w2');
  // Refused while w1's session lives by rule 1; taken by one transaction once it is dead.
  let lease;
  let transactions;
  await eventually(
    async () => {
      // w2's own session must live meanwhile.
      if (fresh.deadline - performance.now() < FAST.leaseMs - FAST.renewMs) {
        await fresh.renew();
      }
      transactions = counting.counts.get('TransactWriteItemsCommand') ?? 0;
      try {
        lease = await fresh.claim('a');
        return true;
      } catch (e) {
        assert.ok(e instanceof LeaseHeldError, `${e}`);
        return false;
      }
    },
    15_000,
    'the takeover',
  );
  assert.ok(Date.now() > stale.expiresAtMs + FAST.clockSkewMs, 'not before expiry + skew');
  assert.equal(lease.fence, old.fence + 1);
  assert.equal(lease.lastSeq, 3);
  assert.equal(counting.counts.get('TransactWriteItemsCommand') - transactions, 1, 'one transaction takes it');
  const taken = await rawItem(table, 'a');
  assert.deepEqual([taken.lease_owner.S, taken.fence.N, taken.session_epoch.N], ['w2', '2', String(fresh.epoch)]);
  // The stale session: its renewal and its lease's checkpoint are refused and write nothing.
  await assert.rejects(stale.renew(), LeaseLostError);
  await assert.rejects(old.checkpoint(4), LeaseLostError);
  await assert.rejects(old.renew(), LeaseLostError);
  assert.deepEqual(await rawItem(table, 'a'), taken);
  assert.deepEqual(await sessionItem(table, 'w1'), staleItem);
});

test("a Worker takes a dead session's 24 connections in transactions of several, not one each", LIMIT, async (t) => {
  const table = await freshTable(FAST);
  const ids = Array.from({ length: 24 }, (_, i) => `d${String(i).padStart(2, '0')}`);
  await startAll(table, ids);
  // A session that claims all 24, then is never renewed: dead at its expiry + skew.
  const dead = await table.createSession('gone');
  for (const id of ids) {
    await dead.claim(id);
  }
  const counting = countingClient();
  const { LeaseTable } = leaselock;
  const onTable = new LeaseTable({ ...FAST, client: counting.sdk, tableName: table.tableName });
  const { conns, handler } = recorder();
  const worker = new Worker({ table: onTable, handler, workerId: 'heir', orphanIntervalMs: 200, logger: quiet });
  const running = worker.run();
  t.after(() => {
    worker.shutdown();
    return running;
  });
  await eventually(() => conns.size === 24, 20_000, 'all 24 taken over');
  for (const id of ids) {
    assert.equal((await rawItem(table, id)).lease_owner.S, 'heir');
  }
  const view = worker.snapshot();
  assert.equal(view.sessionTakeovers, 24);
  // At most 16 claims in flight: two transactions or so, each checking the dead session once.
  const transactions = counting.counts.get('TransactWriteItemsCommand') ?? 0;
  assert.ok(view.takeoverTransactions >= 2 && view.takeoverTransactions <= 6, `${view.takeoverTransactions} takeover transactions`);
  assert.ok(transactions >= view.takeoverTransactions && transactions <= 8, `${transactions} TransactWriteItems for 24 connections`);
});

test('end() frees everything held under the session with one write, and everything held under it stops acting', LIMIT, async () => {
  const table = await freshTable(FAST);
  const ids = ['a', 'b', 'c'];
  await startAll(table, ids);
  const counting = countingClient();
  const { LeaseTable } = leaselock;
  const mine = new LeaseTable({ ...FAST, client: counting.sdk, tableName: table.tableName });
  const session = await mine.createSession('w1');
  const held = await Promise.all(ids.map((id) => session.claim(id)));
  const sent = counting.total();
  await session.end();
  assert.equal(counting.total() - sent, 1, 'one request');
  // Nothing acts under the ended session: its leases' deadlines have passed, and what is asked
  // of them or of the session is refused without a request.
  for (const lease of held) {
    assert.ok(lease.deadline <= performance.now(), `${lease.id}: deadline ${lease.deadline}`);
  }
  await assert.rejects(held[0].checkpoint(1), LeaseLostError);
  await assert.rejects(held[1].renew(), LeaseLostError);
  await assert.rejects(session.claim('a'), LeaseLostError);
  await assert.rejects(session.renew(), LeaseLostError);
  assert.equal(counting.total() - sent, 1, 'nothing sent after the end');
  assert.equal((await sessionItem(table, 'w1')).lease_expires_at_ms.N, '0');
  // Everything is free at once, without waiting for any expiry.
  const next = await table.createSession('w2');
  const leases = await Promise.all(ids.map((id) => next.claim(id)));
  assert.deepEqual(
    leases.map((l) => l.fence),
    [2, 2, 2],
  );
});

test('a session lost while its deadline is ahead: the renewal that learns it stops every lease held under it at once', LIMIT, async () => {
  const table = await freshTable(FAST);
  const ids = ['a', 'b'];
  await startAll(table, ids);
  const session = await table.createSession('w1');
  const held = await Promise.all(ids.map((id) => session.claim(id)));
  // Behind its back: the session item gets another epoch.
  const item = await sessionItem(table, 'w1');
  await putRaw(table, { ...item, fence: { N: String(session.epoch + 1) } });
  for (const lease of held) {
    assert.ok(lease.deadline > performance.now() + 1_000, 'the leases still think they act');
  }
  await assert.rejects(session.renew(), LeaseLostError);
  for (const lease of held) {
    assert.ok(lease.deadline <= performance.now(), `${lease.id}: deadline ${lease.deadline} after the session was lost`);
  }
  await assert.rejects(held[0].checkpoint(1), LeaseLostError);
  await assert.rejects(session.claim('a'), LeaseLostError);
  assert.equal((await rawItem(table, 'a')).last_seq, undefined, 'nothing written');
});

test("a claim under a session takes a signal as using() does: already aborted, nothing is sent; aborted later, the lease's signal aborts with its reason (Shutdown) and the session still covers the lease; a release aborts it with Released", LIMIT, async () => {
  const table = await freshTable(FAST);
  await startAll(table, ['a', 'b']);
  const counting = countingClient();
  const { LeaseTable } = leaselock;
  const mine = new LeaseTable({ ...FAST, client: counting.sdk, tableName: table.tableName });
  const session = await mine.createSession('w1');
  const sent = counting.total();
  const refused = new AbortController();
  refused.abort(new Error('not now'));
  await assert.rejects(session.claim('a', { signal: refused.signal }), /not now/);
  assert.equal(counting.total(), sent, 'nothing sent');
  assert.equal((await rawItem(table, 'a')).session_epoch, undefined, 'not claimed');

  const controller = new AbortController();
  const lease = await session.claim('a', { signal: controller.signal });
  assert.equal(lease.signal.aborted, false);
  assert.equal(lease.cancelReason, undefined);
  const reason = new Error('winding down');
  controller.abort(reason);
  assert.equal(lease.signal.aborted, true);
  assert.equal(lease.signal.reason, reason, "the caller's reason, as using()'s signal");
  assert.equal(lease.cancelReason, 'Shutdown');
  // As under using(): the lease stays held while its holder winds down.
  const before = lease.deadline;
  await new Promise((resolve) => setTimeout(resolve, 20));
  await session.renew();
  assert.ok(lease.deadline > before && lease.deadline === session.deadline);
  await lease.checkpoint(3);
  assert.equal((await rawItem(table, 'a')).last_seq.N, '3');
  await lease.release();
  assert.equal(lease.cancelReason, 'Shutdown', 'the first reason stays');
  assert.equal((await rawItem(table, 'a')).lease_expires_at_ms.N, '0');

  // A signal that does not abort: released by hand, the lease's signal aborts with Released.
  const other = await session.claim('b', { signal: new AbortController().signal });
  await other.release();
  assert.equal(other.cancelReason, 'Released');
  assert.equal(other.signal.reason.reason, 'Released');
  // A per-item lease has no signal of its own (using() gives one).
  const plain = await freshTable({});
  await plain.start('p', 'ws://127.0.0.1:9/p');
  const held = await plain.acquire('p', { owner: 'w1' });
  assert.equal(held.signal, undefined);
  await held.release();
  await session.end();
});

test("a session lease's signal aborts when its session is lost (Lost) or ended (Released), and at its deadline (Deadline) when nothing renews the session", LIMIT, async () => {
  const table = await freshTable(FAST);
  await startAll(table, ['a', 'b', 'c']);
  const ended = await table.createSession('w1');
  const a = await ended.claim('a', { signal: new AbortController().signal });
  await ended.end();
  assert.equal(a.cancelReason, 'Released');
  assert.equal(a.signal.reason.reason, 'Released');

  const lost = await table.createSession('w2');
  const b = await lost.claim('b');
  const item = await sessionItem(table, 'w2');
  await putRaw(table, { ...item, fence: { N: String(lost.epoch + 1) } });
  assert.equal(b.signal.aborted, false);
  await assert.rejects(lost.renew(), LeaseLostError);
  assert.equal(b.cancelReason, 'Lost');
  assert.ok(b.signal.reason instanceof LeaseLostError && b.signal.reason.reason === 'Lost');

  const idle = await table.createSession('w3');
  const c = await idle.claim('c');
  const deadline = c.deadline;
  // Its timer does not keep the process alive (as AbortSignal.timeout's): this one does.
  let timer;
  const late = new Promise((resolve) => (timer = setTimeout(resolve, deadline - performance.now() + 1_000)));
  await Promise.race([late, new Promise((resolve) => c.signal.addEventListener('abort', resolve, { once: true }))]);
  clearTimeout(timer);
  const at = performance.now();
  assert.ok(at >= deadline - 1 && at < deadline + 500, `aborted at ${at}, deadline ${deadline}`);
  assert.equal(c.cancelReason, 'Deadline');
  assert.ok(c.signal.reason instanceof LeaseLostError && c.signal.reason.reason === 'Deadline');
  // Past its deadline the lease is still given up (conditionally) as any lease.
  await assert.rejects(c.checkpoint(1), LeaseLostError);
});

/** A handler that checkpoints every 100 ms until its signal aborts, and records how it ended. */
function recorder() {
  const conns = new Map();
  const handler = async (conn, signal) => {
    // `from`: where this claim resumed (the connection's lastSeq moves with its checkpoints).
    const from = conn.lastSeq ?? 0;
    const seen = { conn, from, seq: from, ended: null, runs: (conns.get(conn.id)?.runs ?? 0) + 1 };
    conns.set(conn.id, seen);
    while (!signal.aborted) {
      await new Promise((resolve) => setTimeout(resolve, 100));
      if (signal.aborted) break;
      await conn.checkpoint(seen.seq + 1).then(
        () => (seen.seq += 1),
        () => {},
      );
    }
    seen.ended = { reason: signal.reason, at: performance.now(), deadline: conn.deadline };
  };
  return { conns, handler };
}

test('a Worker in session mode: one session for everything; a session rewritten behind its back aborts every handler before the deadline; a new epoch claims the work back; shutdown ends the session with one write', LIMIT, async (t) => {
  const counting = countingClient();
  const table = await freshTable(FAST, counting.sdk);
  const ids = ['s1', 's2', 's3'];
  await startAll(table, ids);
  const { conns, handler } = recorder();
  const worker = new Worker({ table, handler, workerId: 'node-w1', orphanIntervalMs: 200, logger: quiet });
  const running = worker.run();
  t.after(() => {
    worker.shutdown();
    return running;
  });
  await eventually(() => conns.size === 3 && [...conns.values()].every((c) => c.seq >= 2), 15_000, 'three handlers checkpointing');
  const epoch = worker.snapshot().sessionEpoch;
  assert.ok(epoch >= 1);
  for (const id of ids) {
    assert.equal((await rawItem(table, id)).session_epoch.N, String(epoch));
  }
  // One session renewal per renew interval for all three: no per-connection renewal.
  const updates = () => counting.counts.get('UpdateItemCommand') ?? 0;
  const mark = updates();
  const checkpoints = () => [...conns.values()].reduce((n, c) => n + c.seq, 0);
  const marked = checkpoints();
  await new Promise((resolve) => setTimeout(resolve, 10 * FAST.renewMs));
  const renewals = updates() - mark - (checkpoints() - marked);
  // Per-connection renewals would be 30 or more. The window's edges can count a checkpoint in
  // flight, and a poll can retire another test's dead session (one UpdateItem) inside it.
  assert.ok(renewals >= 5 && renewals <= 15, `${renewals} session renewals in 10 renew intervals`);

  // Behind its back: the session item gets another epoch (and an expiry that is running out).
  const first = new Map(ids.map((id) => [id, conns.get(id)]));
  const item = await sessionItem(table, 'node-w1');
  await putRaw(table, { ...item, fence: { N: String(epoch + 1) }, lease_expires_at_ms: { N: String(Date.now()) } });
  await eventually(() => [...first.values()].every((c) => c.ended), 5_000, 'every handler aborted');
  for (const seen of first.values()) {
    assert.ok(seen.ended.reason instanceof LeaseLostError, `${seen.ended.reason}`);
    assert.ok(seen.ended.at < seen.ended.deadline, 'aborted before the session deadline');
  }
  // A new epoch afterwards: the worker claims its own earlier epoch's work back (fence + 1).
  await eventually(() => ids.every((id) => conns.get(id) !== first.get(id) && !conns.get(id).ended), 15_000, 'work claimed back');
  const now = worker.snapshot();
  assert.ok(now.sessionEpoch > epoch + 1, `epoch ${now.sessionEpoch}`);
  assert.deepEqual(now.held, ids);
  for (const id of ids) {
    assert.equal(conns.get(id).conn.fence, first.get(id).conn.fence + 1);
  }

  // Graceful shutdown: the handlers end, then one session write frees everything.
  const sent = counting.total();
  worker.shutdown();
  const snapshot = await running;
  assert.deepEqual(snapshot.held, []);
  const atShutdown = counting.log.slice(sent).filter((r) => r.command === 'UpdateItemCommand');
  const ends = atShutdown.filter((r) => r.id === 'session/node-w1' && r.zero);
  assert.equal(ends.length, 1, 'one session write frees everything');
  assert.deepEqual(
    atShutdown.filter((r) => r.id !== 'session/node-w1' && r.zero),
    [],
    'no per-connection release',
  );
  assert.equal((await sessionItem(table, 'node-w1')).lease_expires_at_ms.N, '0');
  for (const id of ids) {
    assert.equal((await rawItem(table, id)).lease_owner.S, 'node-w1');
  }
  const next = await table.createSession('w2');
  await Promise.all(ids.map((id) => next.claim(id)));
});

test('session mode with hints: a hint is claimed under the session; shutdown ends the session, then hints the work', LIMIT, async (t) => {
  const table = await freshTable(FAST);
  const sqs = new SQSClient({});
  const { QueueUrl: queueUrl } = await sqs.send(new CreateQueueCommand({ QueueName: `${table.tableName}-hints` }));
  const { conns, handler } = recorder();
  // Orphan polls a minute apart: only the hint can explain a quick claim.
  const worker = new Worker({ table, handler, sqs, queueUrl, workerId: 'node-h', orphanIntervalMs: 60_000, hintWaitMs: 1_000, logger: quiet });
  const running = worker.run();
  t.after(() => {
    worker.shutdown();
    return running;
  });
  await eventually(() => worker.snapshot().sessionEpoch !== null && worker.snapshot().orphanPolls >= 1, 8_000, 'session open');
  await startAll(table, ['h1', 'h2']);
  for (const id of ['h1', 'h2']) {
    await sqs.send(new SendMessageCommand({ QueueUrl: queueUrl, MessageBody: JSON.stringify({ connection_id: id }) }));
  }
  await eventually(() => conns.has('h1') && conns.has('h2'), 8_000, 'claimed from the hints');
  const epoch = worker.snapshot().sessionEpoch;
  assert.equal((await rawItem(table, 'h1')).session_epoch.N, String(epoch));
  // The first hint also wakes the orphan query, which may claim both before the second hint is
  // read: wait until the worker has settled (deleted) both, so the queue holds only what
  // shutdown sends.
  await eventually(async () => {
    const { Attributes: a } = await sqs.send(new GetQueueAttributesCommand({
      QueueUrl: queueUrl,
      AttributeNames: ['ApproximateNumberOfMessages', 'ApproximateNumberOfMessagesNotVisible'],
    }));
    return Number(a.ApproximateNumberOfMessages) + Number(a.ApproximateNumberOfMessagesNotVisible) === 0;
  }, 8_000, 'both hints settled (deleted from the queue)');
  worker.shutdown();
  await running;
  assert.equal((await sessionItem(table, 'node-h')).lease_expires_at_ms.N, '0');
  const out = await sqs.send(new ReceiveMessageCommand({ QueueUrl: queueUrl, MaxNumberOfMessages: 10, WaitTimeSeconds: 1 }));
  const hinted = (out.Messages ?? []).map((m) => JSON.parse(m.Body).connection_id).sort();
  assert.deepEqual(hinted, ['h1', 'h2']);
});

test('fleet-aware balance: every session renewal reports the load; a worker that joins gets its share by hand-overs, each resumed from its checkpoint; balance: false keeps what it claimed', LIMIT, async (t) => {
  const table = await freshTable(FAST);
  const ids = Array.from({ length: 12 }, (_, i) => `b${String(i).padStart(2, '0')}`);
  await startAll(table, ids);
  const spawn = (workerId, options = {}) => {
    const rec = recorder();
    const worker = new Worker({ table, handler: rec.handler, workerId, orphanIntervalMs: 200, logger: quiet, ...options });
    const running = worker.run();
    t.after(() => {
      worker.shutdown();
      return running;
    });
    return { worker, running, ...rec };
  };
  const held = (w) => w.worker.snapshot().held.length;

  const a = spawn('node-a');
  await eventually(() => held(a) === 12, 15_000, 'the first worker holds everything');
  await eventually(async () => {
    const s = await sessionItem(table, 'node-a');
    return s.held_connections?.N === '12' && s.max_connections?.N === '700';
  }, 5_000, 'its session renewal reports 12 of 700');
  assert.equal(a.worker.snapshot().claimLimit, 12);

  const b = spawn('node-b');
  await eventually(() => held(a) + held(b) === 12 && Math.abs(held(a) - held(b)) <= 2 && held(b) >= 5, 20_000, 'an even split');
  await eventually(() => a.worker.snapshot().claimLimit === 6 && b.worker.snapshot().claimLimit === 6, 5_000, 'both at a share of 6');
  const moved = [...b.conns.keys()];
  assert.equal(a.worker.snapshot().handedOver, moved.length, 'every connection B holds was handed over by A');
  for (const id of moved) {
    const before = a.conns.get(id);
    assert.equal(before.ended.reason.reason, 'HandOver', `${id}: A's handler was told why`);
    assert.equal(b.conns.get(id).from, before.seq, `${id}: B resumed from A's last checkpoint`);
    assert.ok(b.conns.get(id).conn.fence > before.conn.fence, `${id}: a new fence`);
  }
  // Once even, nothing keeps moving.
  const handedOver = a.worker.snapshot().handedOver;
  const polls = b.worker.snapshot().orphanPolls;
  await eventually(() => b.worker.snapshot().orphanPolls >= polls + 5, 10_000, 'five more polls');
  assert.equal(a.worker.snapshot().handedOver + b.worker.snapshot().handedOver, handedOver, 'no churn once even');

  // Without balance a worker that joins takes nothing from one that holds everything.
  const c = spawn('node-c', { balance: false });
  const d = spawn('node-d', { balance: false });
  a.worker.shutdown();
  b.worker.shutdown();
  await Promise.all([a.running, b.running]);
  await eventually(() => held(c) + held(d) === 12, 15_000, 'the freed work claimed by the unbalanced workers');
  const split = [held(c), held(d)];
  assert.equal(c.worker.snapshot().claimLimit, null);
  const cPolls = c.worker.snapshot().orphanPolls;
  await eventually(() => c.worker.snapshot().orphanPolls >= cPolls + 5, 10_000, 'five more polls');
  assert.deepEqual([held(c), held(d)], split, 'nothing moves without balance');
  assert.equal(c.worker.snapshot().handedOver + d.worker.snapshot().handedOver, 0);
});

test('at its share, a worker takes the hints of a peer that left at once: one read of the sessions raises its claim limit, before any orphan poll could', LIMIT, async (t) => {
  // A's orphan and owner-index queries can be held back (the session listing is not): while
  // they are, only the hint path can claim what the leaving peer hinted.
  const { LeaseTable } = leaselock;
  const HELD_BACK_MS = 6_000;
  const slow = { on: false, waiting: 0 };
  const sdk = client();
  sdk.middlewareStack.add(
    (next, context) => async (args) => {
      const listing = ':session' in (args.input.ExpressionAttributeValues ?? {});
      if (slow.on && context.commandName === 'QueryCommand' && !listing) {
        slow.waiting += 1;
        await new Promise((resolve) => setTimeout(resolve, HELD_BACK_MS));
        slow.waiting -= 1;
      }
      return next(args);
    },
    { step: 'initialize', name: 'holdBackOrphanQueries' },
  );
  const table = await freshTable(FAST);
  const slowTable = new LeaseTable({ ...FAST, client: sdk, tableName: table.tableName });
  const sqs = new SQSClient({});
  const { QueueUrl: queueUrl } = await sqs.send(new CreateQueueCommand({ QueueName: `${table.tableName}-hints` }));
  const ids = Array.from({ length: 12 }, (_, i) => `p${String(i).padStart(2, '0')}`);
  await startAll(table, ids);
  const spawn = (workerId, onTable, sources) => {
    const rec = recorder();
    const logger = { warn() {}, info: (message, fields) => message === 'claimed' && sources?.push([fields.connectionId, fields.source]) };
    const worker = new Worker({ table: onTable, handler: rec.handler, sqs, queueUrl, workerId, orphanIntervalMs: 200, hintWaitMs: 1_000, logger });
    const running = worker.run();
    t.after(() => {
      slow.on = false;
      worker.shutdown();
      return running;
    });
    return { worker, running, ...rec };
  };
  const held = (w) => w.worker.snapshot().held;
  const sources = [];
  const a = spawn('node-a', slowTable, sources);
  await eventually(() => held(a).length === 12, 15_000, 'the first worker holds everything');
  const b = spawn('node-b', table);
  await eventually(() => held(a).length === 6 && held(b).length === 6, 20_000, 'six each');
  await eventually(() => a.worker.snapshot().claimLimit === 6, 5_000, 'A at a share of 6');
  const leaving = held(b);

  slow.on = true;
  await eventually(() => slow.waiting >= 1, 5_000, "A's orphan poll held back");
  sources.length = 0;
  b.worker.shutdown();
  await b.running;
  // The held-back poll needs two held-back queries (the orphans, then the owner index) to claim.
  await eventually(() => held(a).length === 12, HELD_BACK_MS - 2_000, "A holds the leaving peer's work, from its hints");
  assert.deepEqual(
    sources.filter(([, source]) => source === 'hint').map(([id]) => id).sort(),
    leaving,
    'every connection of the peer that left was claimed from its hint',
  );
  assert.equal(a.worker.snapshot().claimLimit, 12);
});
