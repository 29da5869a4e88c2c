'use strict';
// Ambiguous writes: the client's middleware lets a request be applied and then throws a
// timeout-like error instead of its response (inside the SDK's retry loop, as a lost response
// is). acquire, renew, checkpoint and release must resolve from the protocol's re-read.
const test = require('node:test');
const assert = require('node:assert/strict');
const { performance } = require('node:perf_hooks');
const { SeqNotIncreasingError } = require('..');
const { client, freshTable, rawItem } = require('./helpers');

/** A client whose next `lose` requests of `command` are applied but answered by a timeout. */
function lossyClient() {
  const sdk = client();
  const plan = { command: null, left: 0, applied: true };
  const sent = {};
  sdk.middlewareStack.addRelativeTo(
    (next, context) => async (args) => {
      sent[context.commandName] = (sent[context.commandName] ?? 0) + 1;
      if (context.commandName !== plan.command || plan.left === 0) {
        return next(args);
      }
      plan.left -= 1;
      if (plan.applied) {
        await next(args);
      }
      const lost = new Error('socket hang up: the response was lost');
      lost.name = 'TimeoutError';
      lost.code = 'ECONNRESET';
      throw lost;
    },
    { name: 'loseResponses', relation: 'after', toMiddleware: 'retryMiddleware' },
  );
  return {
    sdk,
    sent,
    lose(command, count = 1, applied = true) {
      Object.assign(plan, { command, left: count, applied });
      for (const k of Object.keys(sent)) delete sent[k];
    },
  };
}

test('acquire whose response is lost: the re-read finds our claim', async () => {
  const c = lossyClient();
  const table = await freshTable({}, c.sdk);
  c.lose('UpdateItemCommand');
  const sentAt = performance.now();
  const lease = await table.acquire('a', { owner: 'w' });
  assert.deepEqual([lease.owner, lease.fence], ['w', 1]);
  assert.deepEqual(c.sent, { UpdateItemCommand: 1, GetItemCommand: 1 });
  // The deadline counts from the first send: the earliest the claim can have been written.
  assert.ok(lease.deadline <= sentAt + 2 + table.leaseMs - table.clockSkewMs);
  assert.deepEqual([(await table.get('a')).owner, (await table.get('a')).fence], ['w', 1]);
});

test('acquire whose request never arrived: sent again, claimed once', async () => {
  const c = lossyClient();
  const table = await freshTable({}, c.sdk);
  c.lose('UpdateItemCommand', 1, false);
  const lease = await table.acquire('b', { owner: 'w' });
  assert.equal(lease.fence, 1);
  assert.deepEqual(c.sent, { UpdateItemCommand: 2, GetItemCommand: 1 });
});

test('renew whose response is lost: the re-read shows our expiry', async () => {
  const c = lossyClient();
  const table = await freshTable({}, c.sdk);
  const lease = await table.acquire('r', { owner: 'w' });
  const before = lease.expiresAtMs;
  await new Promise((resolve) => setTimeout(resolve, 20));
  c.lose('UpdateItemCommand');
  await lease.renew();
  assert.deepEqual(c.sent, { UpdateItemCommand: 1, GetItemCommand: 1 });
  const stored = await rawItem(table, 'r');
  assert.ok(lease.expiresAtMs > before);
  assert.equal(String(lease.expiresAtMs), stored.lease_expires_at_ms.N);
  assert.equal(lease.fence, 1);
});

test('checkpoint whose response is lost: resolves, and the sequence number was written once', async () => {
  const c = lossyClient();
  const table = await freshTable({}, c.sdk);
  const lease = await table.acquire('c', { owner: 'w' });
  await lease.checkpoint(4);
  c.lose('UpdateItemCommand');
  await lease.checkpoint(9);
  assert.deepEqual(c.sent, { UpdateItemCommand: 1, GetItemCommand: 1 });
  assert.equal(lease.lastSeq, 9);
  assert.equal((await rawItem(table, 'c')).last_seq.N, '9');
  await assert.rejects(lease.checkpoint(9), SeqNotIncreasingError);
});

test('release whose response is lost: the re-read shows it released', async () => {
  const c = lossyClient();
  const table = await freshTable({}, c.sdk);
  const lease = await table.acquire('d', { owner: 'w' });
  c.lose('UpdateItemCommand');
  await lease.release();
  assert.deepEqual(c.sent, { UpdateItemCommand: 1, GetItemCommand: 1 });
  assert.equal((await rawItem(table, 'd')).lease_expires_at_ms.N, '0');
});
