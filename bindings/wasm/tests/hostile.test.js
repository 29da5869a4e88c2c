'use strict';
// Hostile input at every public entry point: seeded generated values (control and invisible
// format characters, lone surrogates, huge strings, huge, negative, fractional and non-finite
// numbers, wrong types) are each refused with InvalidInputError naming the option, in a one-line
// message under 1 KB without a raw control character; the wasm module never traps and a full
// scan of the table is unchanged.
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { execFileSync } = require('node:child_process');
const { ScanCommand } = require('@aws-sdk/client-dynamodb');
const { LeaderElector, LeaseTable, Worker, InvalidInputError, InternalError } = require('..');
const { freshTable } = require('./helpers');

/** mulberry32: a small seeded generator, so a failure can be replayed. */
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const SEED = Number(process.env.LEASELOCK_HOSTILE_SEED ?? 20251203);
const CASES_PER_ENTRY = 60;
const random = rng(SEED);
const int = (lo, hi) => lo + Math.floor(random() * (hi - lo + 1));
const pick = (xs) => xs[int(0, xs.length - 1)];

// Core's refused characters (leaselock::config::is_refused_char) and lone surrogates.
const CONTROL = [...Array(32).keys(), ...Array.from({ length: 33 }, (_, i) => 0x7f + i)].map((c) => String.fromCharCode(c));
const FORMAT = ['\u00ad', '\u061c', '\u180e', '\u200b', '\u200f', '\u2028', '\u202e', '\u2066', '\u206f', '\ufeff', '\ufffa', '\u{e0041}'];
const SURROGATES = ['\ud800', '\udbff', '\udc00', '\udfff'];
const REFUSED = new RegExp(`[${[...CONTROL, ...FORMAT.slice(0, -1)].map((c) => `\\u{${c.codePointAt(0).toString(16)}}`).join('')}\\u{e0000}-\\u{e007f}]|[\\ud800-\\udfff]`, 'u');
const PRINTABLE = 'abcXYZ019 -_./:#é日本🚀"\\\'';
const THIRTY_DAYS_MS = 30 * 24 * 3600 * 1000;

function printable() {
  let s = '';
  for (let i = int(0, 20); i > 0; i--) {
    s += pick([...PRINTABLE]);
  }
  return s;
}

function withBadChar() {
  const s = printable();
  const at = int(0, s.length);
  return s.slice(0, at) + pick([...CONTROL, ...FORMAT, ...SURROGATES]) + s.slice(at);
}

function hugeText() {
  return pick([() => 'x'.repeat(int(4097, 300_000)), () => '日'.repeat(int(1366, 20_000)), () => '\x1b[2J'.repeat(int(1025, 20_000))])();
}

function wrongType() {
  return pick([
    () => int(-1e9, 1e9),
    () => pick([NaN, Infinity, -Infinity, 2 ** 64, -0.5]),
    () => random() < 0.5,
    () => ({ toString: () => 'id' }),
    () => [printable()],
    () => BigInt(int(0, 1e6)),
    () => Symbol('id'),
    () => () => 'id',
  ])();
}

const hostileText = () => pick([withBadChar, withBadChar, hugeText, wrongType])();
const hostileId = () => (random() < 0.05 ? '' : hostileText());
const notAnInt = () => pick([NaN, Infinity, -Infinity, 1.5, '20000', true, [2], {}, 10n, Symbol('ms')]);
const hostileMs = () => pick([() => -int(1, 1e12), () => THIRTY_DAYS_MS + int(1, 1e12), () => 2 ** 70, notAnInt])();
const hostileCount = (limit) => () => pick([() => -int(1, 1e9), () => limit + int(1, 1e9), () => 2 ** 61, notAnInt])();
const hostileNumber = () => pick([NaN, Infinity, -Infinity, '1', true, [1], {}, 5n]);

let cases = 0;

/** `call` rejects with InvalidInputError naming one of `fields`, message clean and bounded. */
async function refused(fields, call, label) {
  cases += 1;
  let error;
  try {
    await call();
  } catch (e) {
    error = e;
  }
  assert.ok(error !== undefined, `${label}: accepted`);
  assert.ok(!(error instanceof InternalError), `${label}: the trap guard was reached: ${error.message}`);
  assert.ok(error instanceof InvalidInputError, `${label}: ${error?.name}: ${String(error?.message).slice(0, 300)}`);
  assert.ok([].concat(fields).includes(error.field), `${label}: field ${error.field}, message ${error.message.slice(0, 300)}`);
  assert.ok(Buffer.byteLength(error.message) < 1024, `${label}: ${Buffer.byteLength(error.message)} bytes`);
  assert.ok(!REFUSED.test(error.message), `${label}: raw character in ${JSON.stringify(error.message.slice(0, 300))}`);
  assert.ok(!REFUSED.test(error.field), `${label}: raw character in the field`);
}

test('hostile values at every entry point are refused naming the option; the table is unchanged', { timeout: 120_000 }, async () => {
  const table = await freshTable();
  const { client, tableName } = table;
  await table.start('stream-1', 'wss://feed.example/1');
  const lease = await table.acquire('stream-1', { owner: 'owner-1' });
  const sessions = new LeaseTable({ client, tableName, mode: 'session' });
  const elector = new LeaderElector({ table, owner: 'candidate-1' });
  const sqs = { send: async () => assert.fail('nothing is sent') };
  const action = async () => assert.fail('the action never runs');
  const scan = async () => {
    const out = await client.send(new ScanCommand({ TableName: tableName, ConsistentRead: true }));
    return out.Items.sort((a, b) => a.connection_id.S.localeCompare(b.connection_id.S));
  };
  const before = await scan();
  const newTable = (options) => () => new LeaseTable({ client, tableName, ...options });
  const worker = (options) => () => new Worker({ table, handler: action, ...options });
  const newElector = (options) => () => new LeaderElector({ table, owner: 'c', ...options });

  // [label, fields accepted as the name of the option, generator, call with the value]
  const entries = [
    ['LeaseTable tableName', 'tableName', hostileId, (v) => newTable({ tableName: v })],
    ['LeaseTable leaseMs', 'leaseMs', hostileMs, (v) => newTable({ leaseMs: v })],
    ['LeaseTable renewMs', 'renewMs', hostileMs, (v) => newTable({ renewMs: v })],
    ['LeaseTable clockSkewMs', 'clockSkewMs', hostileMs, (v) => newTable({ clockSkewMs: v })],
    ['LeaseTable operationBudgetMs', 'operationBudgetMs', hostileMs, (v) => newTable({ operationBudgetMs: v })],
    ['LeaseTable keyPrefix', 'keyPrefix', hostileText, (v) => newTable({ keyPrefix: v })],
    ['LeaseTable indexName', 'indexName', hostileId, (v) => newTable({ indexName: v })],
    ['LeaseTable mode', 'mode', hostileId, (v) => newTable({ mode: v })],
    ['start id', 'id', hostileId, (v) => () => table.start(v, 'wss://feed.example/x')],
    ['start url', 'url', hostileId, (v) => () => table.start('stream-2', v)],
    ['stop id', 'id', hostileId, (v) => () => table.stop(v)],
    ['acquire id', 'id', hostileId, (v) => () => table.acquire(v, { owner: 'owner-2' })],
    ['acquire owner', 'owner', hostileId, (v) => () => table.acquire('stream-1', { owner: v })],
    ['get id', 'id', hostileId, (v) => () => table.get(v)],
    ['ownedBy owner', 'owner', hostileId, (v) => () => table.ownedBy(v)],
    ['desiredStates ids', 'id', hostileId, (v) => () => table.desiredStates([v])],
    ['createSession owner', 'owner', hostileId, (v) => () => sessions.createSession(v)],
    ['checkpoint seq', 'seq', () => pick([-1, 2 ** 64, ...[notAnInt()]]), (v) => () => lease.checkpoint(v)],
    ['Worker workerId', 'workerId', hostileId, (v) => worker({ workerId: v })],
    ['Worker queueUrl', 'queueUrl', hostileText, (v) => worker({ sqs, queueUrl: v })],
    ['Worker maxConnections', 'maxConnections', hostileCount(100_000), (v) => worker({ maxConnections: v })],
    ['Worker orphanIntervalMs', 'orphanIntervalMs', hostileMs, (v) => worker({ orphanIntervalMs: v })],
    ['Worker desiredStateIntervalMs', 'desiredStateIntervalMs', hostileMs, (v) => worker({ desiredStateIntervalMs: v })],
    ['Worker handlerGraceMs', 'handlerGraceMs', hostileMs, (v) => worker({ handlerGraceMs: v })],
    ['Worker hintWaitMs', 'hintWaitMs', hostileMs, (v) => worker({ hintWaitMs: v })],
    ['Worker balance', 'balance', () => pick([1, 'no', [true], {}, NaN]), (v) => worker({ balance: v })],
    ['LeaderElector owner', 'owner', hostileId, (v) => newElector({ owner: v })],
    ['LeaderElector keyPrefix', 'keyPrefix', hostileText, (v) => newElector({ keyPrefix: v })],
    ['LeaderElector waitMs', 'waitMs', hostileMs, (v) => newElector({ waitMs: v })],
    ['LeaderElector minLeaseMs', 'minLeaseMs', hostileMs, (v) => newElector({ minLeaseMs: v })],
    ['LeaderElector retryDelayMs', 'retryDelayMs', hostileMs, (v) => newElector({ retryDelayMs: v })],
    ['LeaderElector termMs', 'termMs', hostileMs, (v) => newElector({ termMs: v })],
    ['LeaderElector candidateTtlMs', 'candidateTtlMs', hostileMs, (v) => newElector({ candidateTtlMs: v })],
    ['runIfLeader name', 'name', hostileId, (v) => () => elector.runIfLeader(v, action)],
    ['runIfSlot name', 'name', hostileId, (v) => () => elector.runIfSlot(v, 2, action)],
    ['runIfSlot slots', 'slots', () => pick([0, 2 ** 31, hostileCount(1_000)()]), (v) => () => elector.runIfSlot('jobs', v, action)],
    ['runIfElected name', 'name', hostileId, (v) => () => elector.runIfElected(v, {}, 'HighestScore', action)],
    ['runIfElected strategy', 'strategy', hostileId, (v) => () => elector.runIfElected('jobs', {}, v, action)],
    ['runIfElected preferredNode', ['strategy', 'strategy.preferredNode'], hostileId, (v) => () => elector.runIfElected('jobs', {}, { preferredNode: v }, action)],
    ['candidate score', ['candidate', 'candidate.score'], hostileNumber, (v) => () => elector.runIfElected('jobs', { score: v }, 'HighestScore', action)],
    ['candidate load', ['candidate', 'candidate.load'], hostileNumber, (v) => () => elector.runIfElected('jobs', { load: v }, 'HighestScore', action)],
    ['candidate metadata', ['candidate', 'candidate.metadata'], hostileText, (v) => () => elector.runIfElected('jobs', { metadata: { zone: v } }, 'HighestScore', action)],
  ];
  for (const [label, fields, generate, make] of entries) {
    for (let i = 0; i < CASES_PER_ENTRY; i++) {
      const value = generate();
      await refused(fields, make(value), `${label} (seed ${SEED}, case ${i})`);
    }
  }
  // The worst cases of the reports: 5 MB values, quoted bounded.
  const big = '\x1b'.repeat(5_000_000);
  await refused('id', () => table.get(big), '5 MB id');
  await refused('mode', newTable({ mode: big }), '5 MB mode');
  await refused('leaseMs', newTable({ leaseMs: big }), '5 MB leaseMs');
  await refused('options', newTable({ [big]: 1 }), '5 MB option key');
  const plain = 'x'.repeat(5_000_000);
  await refused(['candidate', 'candidate.score'], () => elector.runIfElected('jobs', { score: plain }, 'HighestScore', action), '5 MB score');
  await refused(['candidate', 'candidate.metadata'], () => elector.runIfElected('jobs', { metadata: plain }, 'HighestScore', action), '5 MB metadata');
  // Too many writes for one transaction: named as the argument is (`writes`, as in every language).
  const check = { ConditionCheck: { TableName: tableName, Key: { connection_id: { S: 'stream-1' } }, ConditionExpression: 'attribute_exists(connection_id)' } };
  await refused('writes', () => lease.write(Array.from({ length: 100 }, () => check)), '100 writes');
  await refused('writes', () => lease.write('not an array'), 'writes not an array');
  // Nothing was written, and the module still works.
  assert.deepEqual(await scan(), before);
  assert.equal((await table.get('stream-1')).owner, 'owner-1');
  console.log(`hostile calls refused: ${cases} (seed ${SEED})`);
});

test("the manual's sample prints the Node error for a hostile id", () => {
  const page = fs.readFileSync(path.join(__dirname, '../../../docs/src/api-reference.md'), 'utf8');
  const start = page.indexOf('## What ids, urls and names may be\n');
  assert.ok(start >= 0, 'no "What ids, urls and names may be" section on the API page');
  const end = page.indexOf('\n## ', start + 1);
  const section = page.slice(start, end < 0 ? undefined : end);
  const code = section.match(/```js\n([\s\S]*?)```/)[1];
  const expected = section.match(/```text\n([\s\S]*?)```/)[1];
  const out = execFileSync(process.execPath, ['--input-type=module', '-e', code], {
    cwd: path.join(__dirname, '..'),
    stdio: ['ignore', 'pipe', 'ignore'],
  }).toString();
  assert.equal(out, expected);
});
