'use strict';
// examples/node_worker.mjs against the local feed (`leaselock upstream`): two runs of the
// worker process, each stopped by SIGTERM; the second resumes where the first checkpointed, and
// the messages table holds every message of every stream exactly once, in order.
const test = require('node:test');
const assert = require('node:assert/strict');
const net = require('node:net');
const path = require('node:path');
const { spawn, execFileSync } = require('node:child_process');
const { ScanCommand } = require('@aws-sdk/client-dynamodb');
const { LeaseTable } = require('..');
const { client, eventually } = require('./helpers');

const root = path.join(__dirname, '../../..');
const cli = path.join(root, 'target/debug/leaselock');
const STREAMS = ['feed-1', 'feed-2'];

function freePort() {
  return new Promise((resolve) => {
    const server = net.createServer().listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

/** Runs `cmd`, resolving { code, signal, stdout } when it exits. */
function run(cmd, args, env) {
  const child = spawn(cmd, args, { cwd: root, env, stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  child.stdout.on('data', (c) => (stdout += c));
  child.stderr.on('data', () => {});
  child.exited = new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal, stdout })));
  return child;
}

for (const mode of ['per-item', 'session']) {
test(`the Node reference worker (${mode}) streams, checkpoints, hands over on SIGTERM and resumes`, { timeout: 90_000 }, async (t) => {
  const suffix = `${process.pid}-${Date.now().toString(36)}`;
  const env = {
    ...process.env,
    LEASELOCK_MODE: mode,
    LEASELOCK_TABLE: `example-${suffix}`,
    LEASELOCK_MESSAGES_TABLE: `example-msgs-${suffix}`,
    // Session mode on a sharded orphan index: a worker that ignored the setting would look for
    // work under `STARTED` alone and find none.
    LEASELOCK_ORPHAN_SHARDS: mode === 'session' ? '4' : '1',
  };
  const port = await freePort();
  execFileSync(cli, ['table', 'create'], { env, stdio: 'ignore' });
  const upstream = run(cli, ['upstream', '--listen', `127.0.0.1:${port}`, '--rate', '40'], env);
  const sdk = client();
  const table = new LeaseTable({
    client: sdk,
    tableName: env.LEASELOCK_TABLE,
    mode: mode === 'session' ? 'session' : 'item',
    orphanShards: Number(env.LEASELOCK_ORPHAN_SHARDS),
  });
  try {
    for (const id of STREAMS) {
      await eventually(() => table.start(id, `ws://127.0.0.1:${port}/${id}`).then(() => true, () => false), 5_000, 'start');
    }
    const lastSeqs = async () => Promise.all(STREAMS.map(async (id) => (await table.get(id)).lastSeq ?? 0));
    let floor = 0;
    for (const runNo of [1, 2]) {
      const worker = run(process.execPath, ['examples/node_worker.mjs'], env);
      t.after(() => worker.kill('SIGKILL'));
      await eventually(async () => (await lastSeqs()).every((s) => s >= floor + 20), 15_000, `run ${runNo} progress`);
      worker.kill('SIGTERM');
      const { code, signal } = await worker.exited;
      assert.deepEqual({ code, signal }, { code: 0, signal: null });
      for (const id of STREAMS) {
        const item = await table.get(id);
        if (mode === 'session') {
          // Freed by the session's end (one write), not per stream.
          assert.equal(item.fence, runNo, `${id} claimed once in run ${runNo}`);
        } else {
          assert.deepEqual([item.fence, item.expiresAtMs], [runNo, 0], `${id} released after run ${runNo}`);
        }
      }
      if (mode === 'session') {
        // (An earlier run's session left with nothing may have been retired from the listing.)
        const sessions = await table.sessions();
        assert.ok(sessions.length >= 1 && sessions.length <= runNo, `${sessions.length} sessions`);
        assert.ok(sessions.every((s) => s.expiresAtMs === 0), 'every session ended');
      }
      floor = Math.min(...(await lastSeqs()));
    }
    const rows = [];
    let start;
    do {
      const page = await sdk.send(new ScanCommand({ TableName: env.LEASELOCK_MESSAGES_TABLE, ExclusiveStartKey: start }));
      rows.push(...page.Items);
      start = page.LastEvaluatedKey;
    } while (start);
    for (const id of STREAMS) {
      const mine = rows.filter((r) => r.stream.S === id);
      const seqs = mine.map((r) => Number(r.seq.N)).sort((a, b) => a - b);
      assert.deepEqual(seqs, Array.from({ length: seqs.length }, (_, i) => i + 1), `${id}: every message once, in order`);
      assert.ok(mine.every((r) => r.writes.N === '1'), `${id}: no message written twice`);
      assert.equal(seqs.length, (await table.get(id)).lastSeq, `${id}: checkpoint = last message written`);
      assert.deepEqual(new Set(mine.map((r) => r.fence.N)), new Set(['1', '2']));
    }
  } finally {
    upstream.kill('SIGTERM');
  }
  const stats = JSON.parse((await upstream.exited).stdout.trim().split('\n').pop());
  assert.equal(stats.double_owner, 0);
  assert.ok(stats.connections >= 4);
});
}
