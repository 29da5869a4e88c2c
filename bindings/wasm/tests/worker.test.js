'use strict';
// The Node Worker against the local engine: a lease taken behind a handler's back, STOP, hints,
// and the graceful shutdown on SIGTERM in a real process.
const test = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const { spawn } = require('node:child_process');
const { performance } = require('node:perf_hooks');
const { SQSClient, CreateQueueCommand, SendMessageCommand, ReceiveMessageCommand } = require('@aws-sdk/client-sqs');
const { Worker, LeaseLostError, LeaseStoppedError, ShutdownError } = require('..');
const { freshTable, rawItem, putRaw, eventually } = require('./helpers');

const FAST = { leaseMs: 3_000, renewMs: 300, clockSkewMs: 300 };
const quiet = { warn() {} };

/** A handler that checkpoints every 100 ms until its signal aborts, and records how it ended. */
function recorder() {
  const conns = new Map();
  const handler = async (conn, signal) => {
    const seen = { conn, seq: conn.lastSeq ?? 0, ended: null };
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

async function startAll(table, ids) {
  await Promise.all(ids.map((id) => table.start(id, `ws://127.0.0.1:9/${id}`)));
}

const LIMIT = { timeout: 60_000 };

/** Runs the worker; a failing test still shuts it down, so the test process can end. */
function runWorker(t, worker) {
  const running = worker.run();
  t.after(() => {
    worker.shutdown();
    return running;
  });
  return running;
}

test("a lease taken behind a handler's back aborts its signal before the deadline; the others keep going", LIMIT, async (t) => {
  const table = await freshTable(FAST);
  await startAll(table, ['s1', 's2', 's3']);
  const { conns, handler } = recorder();
  const worker = new Worker({ table, handler, orphanIntervalMs: 200, desiredStateIntervalMs: 500, logger: quiet });
  const running = runWorker(t, worker);
  await eventually(() => conns.size === 3, 10_000, 'three handlers running');
  const s1 = conns.get('s1');
  const item = await rawItem(table, 's1');
  const intruder = {
    ...item,
    lease_owner: { S: 'intruder' },
    fence: { N: String(s1.conn.fence + 1) },
    lease_expires_at_ms: { N: String(Date.now() + 60_000) },
  };
  await putRaw(table, intruder);
  await eventually(() => s1.ended, 5_000, 's1 aborted');
  assert.ok(s1.ended.reason instanceof LeaseLostError, `${s1.ended.reason}`);
  assert.equal(s1.ended.reason.reason, 'Lost');
  assert.ok(s1.ended.at < s1.ended.deadline, 'aborted before the deadline');
  // The other two keep their leases and keep checkpointing, over several renew intervals.
  const marks = ['s2', 's3'].map((id) => conns.get(id).seq);
  await new Promise((resolve) => setTimeout(resolve, 5 * FAST.renewMs));
  assert.ok(conns.get('s2').seq > marks[0] && conns.get('s3').seq > marks[1], 'still checkpointing');
  assert.equal(conns.get('s2').ended, null);
  assert.equal(conns.get('s3').ended, null);
  await eventually(() => worker.snapshot().held.join() === 's2,s3', 2_000, 'held: s2, s3');
  assert.ok(Number((await rawItem(table, 's2')).last_seq.N) >= conns.get('s2').seq);
  worker.shutdown();
  const snapshot = await running;
  assert.equal(snapshot.released, 2);
  assert.equal(snapshot.leasesLost, 1);
  assert.ok(conns.get('s2').ended.reason instanceof ShutdownError);
  for (const id of ['s2', 's3']) {
    assert.equal((await rawItem(table, id)).lease_expires_at_ms.N, '0');
  }
  assert.deepEqual(await rawItem(table, 's1'), intruder);
});

test('STOP aborts the handler with LeaseStoppedError and the lease is released', LIMIT, async (t) => {
  const table = await freshTable(FAST);
  await startAll(table, ['a', 'b']);
  const { conns, handler } = recorder();
  const worker = new Worker({ table, handler, orphanIntervalMs: 200, desiredStateIntervalMs: 300, logger: quiet });
  const running = runWorker(t, worker);
  await eventually(() => conns.size === 2, 10_000, 'two handlers running');
  await table.stop('a');
  await eventually(() => conns.get('a').ended, 5_000, 'a aborted');
  assert.ok(conns.get('a').ended.reason instanceof LeaseStoppedError);
  await eventually(async () => (await table.get('a')).expiresAtMs === 0, 5_000, 'a released');
  assert.equal(conns.get('b').ended, null);
  worker.shutdown();
  const snapshot = await running;
  assert.deepEqual([snapshot.released, snapshot.leasesLost], [2, 0]);
});

test('a hint makes the worker claim at once; released work is hinted on shutdown', LIMIT, async (t) => {
  const table = await freshTable(FAST);
  const sqs = new SQSClient({});
  const { QueueUrl: queueUrl } = await sqs.send(new CreateQueueCommand({ QueueName: `${table.tableName}-hints` }));
  const { conns, handler } = recorder();
  // Orphan polls a minute apart: only the hint can explain a quick claim.
  const worker = new Worker({ table, handler, sqs, queueUrl, orphanIntervalMs: 60_000, hintWaitMs: 1_000, logger: quiet });
  const running = runWorker(t, worker);
  await eventually(() => worker.snapshot().orphanPolls === 1, 5_000, 'first orphan poll');
  await table.start('h1', 'ws://127.0.0.1:9/h1');
  await sqs.send(new SendMessageCommand({ QueueUrl: queueUrl, MessageBody: 'not a hint' }));
  await sqs.send(new SendMessageCommand({ QueueUrl: queueUrl, MessageBody: JSON.stringify({ connection_id: 'h1' }) }));
  await eventually(() => conns.has('h1'), 8_000, 'h1 claimed from the hint');
  // The two messages may come in two receives, h1's first: the unreadable one is read (and
  // dropped) too before shutdown, so the queue then holds only what shutdown sends.
  await eventually(() => worker.snapshot().hintsReceived >= 2, 5_000, 'both messages received');
  worker.shutdown();
  await running;
  const out = await sqs.send(new ReceiveMessageCommand({ QueueUrl: queueUrl, MaxNumberOfMessages: 10, WaitTimeSeconds: 1 }));
  assert.deepEqual((out.Messages ?? []).map((m) => JSON.parse(m.Body)), [{ connection_id: 'h1' }]);
});

test('SIGTERM: a worker process releases its leases and exits cleanly', LIMIT, async (t) => {
  const table = await freshTable(FAST);
  await startAll(table, ['p1', 'p2']);
  const child = spawn(process.execPath, [path.join(__dirname, 'fixtures/worker-process.js'), table.tableName, 'proc-w'], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, LEASELOCK_LOG: 'warn,leaselock::engine=info' },
  });
  let stderr = '';
  child.stderr.on('data', (chunk) => (stderr += chunk));
  const lines = [];
  let buffered = '';
  child.stdout.on('data', (chunk) => {
    buffered += chunk;
    const parts = buffered.split('\n');
    buffered = parts.pop();
    lines.push(...parts.map((l) => JSON.parse(l)));
  });
  const exited = new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));
  t.after(() => child.kill('SIGKILL'));
  await eventually(() => lines.filter((l) => l.claimed).length === 2, 10_000, 'two claims in the child');
  child.kill('SIGTERM');
  assert.deepEqual(await exited, { code: 0, signal: null });
  const snapshot = lines.find((l) => l.snapshot)?.snapshot;
  assert.deepEqual([snapshot.released, snapshot.workerId], [2, 'proc-w']);
  for (const id of ['p1', 'p2']) {
    const item = await table.get(id);
    assert.deepEqual([item.owner, item.expiresAtMs], ['proc-w', 0]);
  }
  // LEASELOCK_LOG asked for the engine's info lines: one JSON line each, with its UTC time.
  const logs = stderr.split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l));
  const claimed = logs.filter((l) => l.message === 'claimed').map((l) => l.connectionId).sort();
  assert.deepEqual(claimed, ['p1', 'p2'], stderr);
  for (const line of logs) {
    assert.match(line.time, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/, JSON.stringify(line));
    assert.ok(['INFO', 'WARN', 'ERROR'].includes(line.level), JSON.stringify(line));
  }
  assert.ok(logs.some((l) => l.message === 'worker stopped' && l.released === 2), stderr);
});

test('LEASELOCK_LOG sets the default logger level as the Rust and Python workers read it', () => {
  const { logLevel } = require('../lib/worker');
  const at = (spec) => ['off', 'error', 'warn', 'info', 'debug', 'trace'][logLevel(spec)];
  assert.equal(at(''), 'warn');
  assert.equal(at('info'), 'info');
  assert.equal(at('ERROR'), 'error');
  assert.equal(at('warn,leaselock::engine=info'), 'info');
  assert.equal(at('leaselock=debug'), 'debug');
  // Directives for other targets do not apply; one that does not parse is skipped.
  assert.equal(at('hyper=trace,warn'), 'warn');
  assert.equal(at('off'), 'off');
});

test("the worker claims once the store's clock is measured; its snapshot and metrics lines carry it", LIMIT, async (t) => {
  const table = await freshTable(FAST);
  await startAll(table, ['c1']);
  const { conns, handler } = recorder();
  const lines = [];
  const metrics = (line) => lines.push(JSON.parse(line));
  const worker = new Worker({ table, handler, orphanIntervalMs: 200, metricsIntervalMs: 300, metrics, logger: quiet });
  runWorker(t, worker);
  await eventually(() => conns.size === 1, 10_000, 'claimed');
  const snap = worker.snapshot();
  assert.equal(snap.claimsPaused, null);
  assert.ok(snap.clockUncertaintyMs <= FAST.clockSkewMs / 2, JSON.stringify(snap));
  assert.ok(Math.abs(snap.clockOffsetMs) <= snap.clockUncertaintyMs + 2, JSON.stringify(snap));
  await eventually(() => lines.some((l) => 'ClockOffsetMs' in l), 5_000, 'a metrics line with the clock');
  const line = lines.find((l) => 'ClockOffsetMs' in l);
  const names = line._aws.CloudWatchMetrics[0].Metrics.map((m) => m.Name);
  assert.ok(names.includes('ClockOffsetMs') && names.includes('ClockUncertaintyMs'), names.join());
  assert.ok(Number.isInteger(line.ClockOffsetMs) && Math.abs(line.ClockOffsetMs) <= line.ClockUncertaintyMs + 2);
});

test("claims wait for the store's clock: a worker told to measure it within 1 ms claims nothing", LIMIT, async (t) => {
  const table = await freshTable(FAST);
  await startAll(table, ['c2']);
  const { conns, handler } = recorder();
  const worker = new Worker({ table, handler, orphanIntervalMs: 200, clockToleranceMs: 1, logger: quiet });
  runWorker(t, worker);
  await eventually(() => worker.snapshot().orphanPolls >= 3, 30_000, 'polling');
  assert.equal(conns.size, 0);
  assert.match(worker.snapshot().claimsPaused, /not within the tolerance of 1 ms/);
});
