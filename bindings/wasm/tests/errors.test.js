'use strict';
// The error classes and bad input refused before any request (a client that records every send).
const test = require('node:test');
const assert = require('node:assert/strict');
const leaselock = require('..');
const esm = import('../index.mjs');
const { fromRust } = require('../lib/errors');

const { LeaseTable, InvalidInputError, LeaseHeldError, StoreError, TimeoutError, TableNotFoundError } = leaselock;

/** A client that only records: a test using it proves nothing was sent. */
function recordingClient() {
  const sent = [];
  return { sent, send: async (command) => sent.push(command) && {} };
}

function rejectsInvalid(field) {
  return (e) => {
    assert.ok(e instanceof InvalidInputError, `${e?.name}: ${e?.message}`);
    assert.equal(e.name, 'InvalidInputError');
    assert.equal(e.field, field);
    assert.equal(e.kind, 'InvalidInput');
    return true;
  };
}

test('every Rust error kind becomes its class, with its fields', () => {
  const held = fromRust({ kind: 'Held', message: 'held by w until 5 ms', owner: 'w', expiresAtMs: 5 });
  assert.ok(held instanceof LeaseHeldError && held instanceof leaselock.LeaseLockError && held instanceof Error);
  assert.deepEqual([held.name, held.owner, held.expiresAtMs], ['LeaseHeldError', 'w', 5]);
  const cause = new Error('sdk');
  const timeout = fromRust({ kind: 'Timeout', message: 't', outcomeUnknown: true }, cause);
  assert.ok(timeout instanceof TimeoutError && timeout instanceof StoreError);
  assert.equal(timeout.outcomeUnknown, true);
  assert.equal(timeout.cause, cause);
  const missing = fromRust({ kind: 'TableNotFound', message: 'm', table: 'leases' });
  assert.ok(missing instanceof TableNotFoundError && missing.table === 'leases');
  const names = {
    Lost: 'LeaseLostError',
    NotFound: 'LeaseNotFoundError',
    Stopped: 'LeaseStoppedError',
    SeqNotIncreasing: 'SeqNotIncreasingError',
    Throttled: 'ThrottledError',
    InvalidInput: 'InvalidInputError',
    Unreachable: 'UnreachableError',
    AccessDenied: 'AccessDeniedError',
    NotConfigured: 'NotConfiguredError',
    Store: 'StoreError',
  };
  for (const [kind, name] of Object.entries(names)) {
    const e = fromRust({ kind, message: 'm', id: 'a' });
    assert.equal(e.name, name);
    assert.equal(e.kind, kind);
    assert.ok(e instanceof leaselock[name]);
  }
});

test('the ES module exports the same classes', async () => {
  const m = await esm;
  assert.equal(m.LeaseTable, LeaseTable);
  assert.equal(m.LeaseHeldError, LeaseHeldError);
});

test('table options are checked before anything is sent, naming the option', () => {
  const client = recordingClient();
  const make = (options) => () => new LeaseTable({ client, tableName: 'leases', ...options });
  assert.throws(make({ leaseMs: '20000' }), rejectsInvalid('leaseMs'));
  assert.throws(make({ leaseMs: 2000, clockSkewMs: 1000 }), rejectsInvalid('leaseMs'));
  assert.throws(make({ renewMs: 0 }), rejectsInvalid('renewMs'));
  assert.throws(make({ clockSkewMs: 0 }), rejectsInvalid('clockSkewMs'));
  assert.throws(make({ tableName: 'x' }), rejectsInvalid('tableName'));
  assert.throws(make({ mode: 'sessions' }), rejectsInvalid('mode'));
  assert.equal(make({ mode: 'session' })().mode, 'session');
  // An unknown key is the caller's text: quoted in the message, the field is `options`.
  assert.throws(make({ leseMs: 1 }), (e) => rejectsInvalid('options')(e) && e.message.includes('"leseMs" is not an option'));
  assert.throws(make({ attributeNames: { fence: 'lease_owner' } }), rejectsInvalid('attributeNames.fence'));
  assert.throws(() => new LeaseTable({ tableName: 'leases' }), rejectsInvalid('client'));
  assert.equal(client.sent.length, 0);
  const table = make({ leaseMs: 3000, renewMs: 500, clockSkewMs: 200 })();
  assert.deepEqual([table.leaseMs, table.renewMs, table.clockSkewMs], [3000, 500, 200]);
});

test('bad arguments reject with InvalidInputError naming the field, and send nothing', async () => {
  const client = recordingClient();
  const table = new LeaseTable({ client, tableName: 'leases' });
  await assert.rejects(table.acquire('', { owner: 'w' }), rejectsInvalid('id'));
  await assert.rejects(table.acquire('a'.repeat(1025), { owner: 'w' }), rejectsInvalid('id'));
  await assert.rejects(table.acquire('a', { owner: '' }), rejectsInvalid('owner'));
  await assert.rejects(table.acquire('a', {}), rejectsInvalid('owner'));
  await assert.rejects(table.acquire(7, { owner: 'w' }), rejectsInvalid('id'));
  await assert.rejects(table.start('a', 'http://feed.example/a'), rejectsInvalid('url'));
  await assert.rejects(table.start('a', 'wss://'), rejectsInvalid('url'));
  await assert.rejects(table.stop(''), rejectsInvalid('id'));
  await assert.rejects(table.get(''), rejectsInvalid('id'));
  await assert.rejects(table.desiredStates(['a', '']), rejectsInvalid('id'));
  await assert.rejects(table.desiredStates('a'), rejectsInvalid('ids'));
  await assert.rejects(table.ownedBy(''), rejectsInvalid('owner'));
  await assert.rejects(table.orphans({ limit: -1 }), rejectsInvalid('limit'));
  assert.equal(client.sent.length, 0);
});

test('worker options are checked, naming the option', () => {
  const table = new LeaseTable({ client: recordingClient(), tableName: 'leases' });
  const handler = async () => {};
  assert.throws(() => new leaselock.Worker({ table, handler, maxConnections: 0 }), rejectsInvalid('maxConnections'));
  assert.throws(() => new leaselock.Worker({ table, handler, workerId: '' }), rejectsInvalid('workerId'));
  assert.throws(() => new leaselock.Worker({ table }), rejectsInvalid('handler'));
  assert.throws(() => new leaselock.Worker({ table, handler, queueUrl: 'q' }), rejectsInvalid('sqs'));
  assert.throws(() => new leaselock.Worker({ table, handler, orphanIntervalMs: 0 }), rejectsInvalid('orphanIntervalMs'));
  const w = new leaselock.Worker({ table, handler });
  assert.match(w.workerId, new RegExp(`-${process.pid}-[0-9a-f]{6}$`));
  assert.equal(w.snapshot().maxConnections, 700);
});

test('binary values in an SDK answer cross as base64 (the DynamoDB JSON form)', () => {
  const { outputJson } = require('../lib/io');
  const plain = { Item: { connection_id: { S: 'a' }, B: { S: 'an attribute named B' } } };
  assert.equal(outputJson(plain), JSON.stringify(plain));
  const binary = { Item: { blob: { B: new Uint8Array([1, 2, 3]) }, set: { BS: [new Uint8Array([255])] } } };
  assert.deepEqual(JSON.parse(outputJson(binary)).Item, { blob: { B: 'AQID' }, set: { BS: ['/w=='] } });
});

// A child without any AWS setting but `env`: no profile files, no instance metadata.
function firstRequestWithout(env) {
  const { execFileSync } = require('node:child_process');
  const os = require('node:os');
  const fs = require('node:fs');
  const path = require('node:path');
  const home = fs.mkdtempSync(path.join(os.tmpdir(), 'leaselock-no-aws-'));
  const clean = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('AWS_')));
  const code = `
    const { DynamoDBClient } = require('@aws-sdk/client-dynamodb');
    const { LeaseTable, NotConfiguredError } = require('.');
    const table = new LeaseTable({ client: new DynamoDBClient({}), tableName: 'leases' });
    const started = performance.now();
    table.get('stream-1').then(
      () => { throw new Error('no error'); },
      (e) => {
        if (!(e instanceof NotConfiguredError)) throw e;
        console.log(JSON.stringify({ took: performance.now() - started, message: e.message }));
      },
    );`;
  try {
    const out = execFileSync(process.execPath, ['-e', code], {
      cwd: path.join(__dirname, '..'),
      env: { ...clean, HOME: home, AWS_EC2_METADATA_DISABLED: 'true', ...env },
      timeout: 60_000,
    });
    return JSON.parse(out.toString());
  } finally {
    fs.rmSync(home, { recursive: true, force: true });
  }
}

test('missing credentials are named at once', () => {
  const { took, message } = firstRequestWithout({ AWS_REGION: 'us-east-1', AWS_ENDPOINT_URL: 'http://127.0.0.1:9' });
  assert.match(message, /^AWS SDK not configured: no credentials \(set AWS_ACCESS_KEY_ID/);
  assert.ok(took < 3000, `${took} ms`);
});

test('a missing region is named at once', () => {
  const keys = { AWS_ACCESS_KEY_ID: 'x', AWS_SECRET_ACCESS_KEY: 'x' };
  for (const endpoint of [{ AWS_ENDPOINT_URL: 'http://127.0.0.1:9' }, {}]) {
    const { took, message } = firstRequestWithout({ ...keys, ...endpoint });
    assert.match(message, /^AWS SDK not configured: no region \(set AWS_REGION/);
    assert.ok(took < 3000, `${took} ms`);
  }
});
