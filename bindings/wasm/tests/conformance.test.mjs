// The cross-language conformance scenarios (tests/conformance/*.json, format in its README)
// replayed through the package's LeaseTable, one test per scenario; raw item reads and writes
// go through @aws-sdk/client-dynamodb. CONFORMANCE_DIR points the runner at another directory.
import test from 'node:test';
import { readdirSync, readFileSync } from 'node:fs';
import { join, dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { randomBytes } from 'node:crypto';
import {
  DynamoDBClient,
  GetItemCommand,
  PutItemCommand,
  UpdateItemCommand,
  paginateScan,
} from '@aws-sdk/client-dynamodb';
import { LeaseTable, LeaseLockError, LeaseHeldError } from '../index.mjs';

const here = dirname(fileURLToPath(import.meta.url));
// A relative CONFORMANCE_DIR is taken from the repository's root, as in the other runners.
const dir = resolve(here, '..', '..', '..', process.env.CONFORMANCE_DIR || join('tests', 'conformance'));

function load() {
  const out = [];
  for (const file of readdirSync(dir).filter((f) => f.endsWith('.json')).sort()) {
    const doc = JSON.parse(readFileSync(join(dir, file), 'utf8'));
    for (const s of doc.scenarios ?? [doc]) {
      if (out.some((o) => o.name === s.name)) {
        throw new Error(`two scenarios named ${s.name}`);
      }
      out.push(s);
    }
  }
  if (out.length === 0) {
    throw new Error(`no scenarios in ${dir}`);
  }
  return out;
}

// The scenarios' vocabulary <-> the package's option and field names.
const snake = (s) => s.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);
const camel = (s) => s.replace(/_([a-z])/g, (_, c) => c.toUpperCase());
const FIELDS = { leaseMs: 'lease_ms', renewMs: 'renew_ms', clockSkewMs: 'clock_skew_ms', keyPrefix: 'key_prefix', indexName: 'index_name' };

function field(name) {
  if (name.startsWith('attributeNames.')) {
    return `attributes.${snake(name.slice('attributeNames.'.length))}`;
  }
  return FIELDS[name] ?? snake(name);
}

function tableOptions(options) {
  const out = {};
  for (const [k, v] of Object.entries(options)) {
    if (k === 'attributes') {
      out.attributeNames = Object.fromEntries(Object.entries(v).map(([a, n]) => [camel(a), n]));
    } else if (['lease_ms', 'renew_ms', 'clock_skew_ms', 'key_prefix', 'index_name', 'mode'].includes(k)) {
      out[camel(k)] = v;
    } else {
      throw new Error(`unknown table option ${k}`);
    }
  }
  return out;
}

const KINDS = {
  Held: 'held', Lost: 'lost', NotFound: 'not_found', Stopped: 'stopped', SeqNotIncreasing: 'seq_not_increasing',
  InvalidInput: 'invalid_input', Throttled: 'throttled', Timeout: 'timeout', Unreachable: 'unreachable',
  AccessDenied: 'access_denied', TableNotFound: 'table_not_found', Store: 'store', Script: 'store',
};

function errorValue(e) {
  if (!(e instanceof LeaseLockError) || !KINDS[e.kind]) {
    throw e;
  }
  const out = { error: KINDS[e.kind] };
  if (e.kind === 'Held') Object.assign(out, { owner: e.owner, expires_at_ms: e.expiresAtMs });
  if (e.kind === 'SeqNotIncreasing') Object.assign(out, { last_seq: e.lastSeq, seq: e.seq });
  if (e.kind === 'InvalidInput') out.field = field(e.field);
  if (out.error === 'store') out.message = e.message;
  return out;
}

const leaseValue = (l) => ({
  id: l.id, owner: l.owner, fence: l.fence, expires_at_ms: l.expiresAtMs, last_seq: l.lastSeq, url: l.url,
  desired_state: l.desiredState,
});
const itemValue = leaseValue;
const sessionValue = (s) => ({ owner: s.owner, epoch: s.epoch, expires_at_ms: s.expiresAtMs });

/** A string argument; `{"repeat": s, "times": n}` builds a long one. */
function text(v) {
  if (v && typeof v === 'object' && 'repeat' in v) return v.repeat.repeat(v.times);
  if (typeof v !== 'string') throw new Error(`not a string argument: ${JSON.stringify(v)}`);
  return v;
}

/** A raw DynamoDB item as the scenarios write it: S as a string, N as a number. */
function rawValue(item) {
  if (!item) return null;
  const out = {};
  for (const [k, v] of Object.entries(item)) {
    if ('S' in v) out[k] = v.S;
    else if ('N' in v) out[k] = /^-?\d+$/.test(v.N) ? Number(v.N) : { N: v.N };
    else out[k] = JSON.stringify(v);
  }
  return out;
}

class Mismatch extends Error {}

const canon = (v) => JSON.stringify(v, (_, x) => (x && typeof x === 'object' && !Array.isArray(x)
  ? Object.fromEntries(Object.entries(x).sort(([a], [b]) => (a < b ? -1 : 1))) : x));

class Run {
  constructor(scenario, client) {
    const safe = scenario.name.replace(/[^A-Za-z0-9-]/g, '-');
    this.tableName = `conf-node-${safe}-${randomBytes(4).toString('hex')}`;
    this.options = scenario.table ?? {};
    this.client = client;
    this.table = new LeaseTable({ client, tableName: this.tableName, ...tableOptions(this.options) });
    const names = this.options.attributes ?? {};
    this.idAttr = names.id ?? 'connection_id';
    this.expAttr = names.expires_at_ms ?? 'lease_expires_at_ms';
    this.prefix = this.options.key_prefix ?? '';
    this.leases = new Map();
    this.sessions = new Map();
    this.vars = new Map();
  }

  saveLease(name, lease) {
    const view = leaseValue(lease);
    if (name !== undefined) {
      this.leases.set(name, lease);
      this.vars.set(name, view);
    }
    return view;
  }

  saveSession(name, session) {
    const view = sessionValue(session);
    if (name !== undefined) {
      this.sessions.set(name, session);
      this.vars.set(name, view);
    }
    return view;
  }

  async call(step) {
    const { op, as: name } = step;
    const t = this.table;
    switch (op) {
      case 'start': return itemValue(await t.start(text(step.id), text(step.url)));
      case 'stop': return itemValue(await t.stop(text(step.id)));
      case 'acquire': return this.saveLease(name, await t.acquire(text(step.id), { owner: text(step.owner) }));
      case 'renew':
      case 'checkpoint':
      case 'release': {
        const lease = this.leases.get(step.lease);
        if (op === 'renew') await lease.renew();
        else if (op === 'checkpoint') await lease.checkpoint(step.seq);
        else await lease.release();
        return this.saveLease(step.lease, lease);
      }
      case 'get': {
        const item = await t.get(text(step.id));
        return item === null ? null : itemValue(item);
      }
      case 'orphans': return { ids: (await t.orphans(step.limit === undefined ? {} : { limit: step.limit })).map((i) => i.id) };
      case 'owned_by': return { ids: (await t.ownedBy(text(step.owner))).map((i) => i.id) };
      case 'desired_states': return { states: Object.fromEntries(await t.desiredStates(step.ids.map(text))) };
      case 'open': {
        const options = tableOptions({ ...this.options, ...step.table });
        new LeaseTable({ client: this.client, tableName: this.tableName, ...options });
        return {};
      }
      case 'create_session': {
        const opts = step.previous_epoch === undefined ? {} : { previousEpoch: step.previous_epoch };
        return this.saveSession(name, await t.createSession(text(step.owner), opts));
      }
      case 'renew_session':
      case 'end_session': {
        const session = this.sessions.get(step.session);
        if (op === 'renew_session') await session.renew();
        else await session.end();
        return this.saveSession(step.session, session);
      }
      case 'claim': return this.saveLease(name, await this.sessions.get(step.session).claim(text(step.id)));
      case 'sessions': {
        const list = (await t.sessions()).map(sessionValue).sort((a, b) => (a.owner < b.owner ? -1 : 1));
        return { sessions: list };
      }
      default: throw new Error(`unknown op ${op}`);
    }
  }

  async contend(step) {
    const owners = step.owners.map(text);
    const results = await Promise.allSettled(owners.map((owner) => this.table.acquire(text(step.id), { owner })));
    const winners = results.filter((r) => r.status === 'fulfilled').map((r) => r.value);
    const failures = results.filter((r) => r.status === 'rejected').map((r) => r.reason);
    const held = failures.filter((e) => e instanceof LeaseHeldError).map((e) => e.owner);
    const got = {
      winners: winners.length,
      held: held.length,
      others: failures.filter((e) => !(e instanceof LeaseHeldError)).map(errorValue),
      held_names_winner: winners.length === 1 && held.every((o) => o === winners[0].owner),
    };
    if (winners.length > 0) {
      Object.assign(got, { fence: winners[0].fence, owner: winners[0].owner });
      this.saveLease(step.as, winners[0]);
    }
    return got;
  }

  rawKey(step) {
    if ('raw_key' in step) return text(step.raw_key);
    if ('session' in step) return `${this.prefix}session/${text(step.session)}`;
    return this.prefix + text(step.id);
  }

  async readRaw(key) {
    const out = await this.client.send(new GetItemCommand({
      TableName: this.tableName, Key: { [this.idAttr]: { S: key } }, ConsistentRead: true,
    }));
    return rawValue(out.Item);
  }

  attribute(v) {
    if (typeof v === 'string') return { S: v };
    if (Number.isInteger(v)) return { N: String(v) };
    if (v && typeof v === 'object' && 'now_plus_ms' in v) return { N: String(Date.now() + v.now_plus_ms) };
    if (v && typeof v === 'object' && ('S' in v || 'N' in v)) return v;
    throw new Error(`not a raw attribute value: ${JSON.stringify(v)}`);
  }

  async step(step) {
    switch (step.op) {
      case 'put_raw': {
        const item = Object.fromEntries(Object.entries(step.item).map(([k, v]) => [k, this.attribute(v)]));
        await this.client.send(new PutItemCommand({ TableName: this.tableName, Item: item }));
        return;
      }
      case 'age':
        await this.client.send(new UpdateItemCommand({
          TableName: this.tableName,
          Key: { [this.idAttr]: { S: this.rawKey(step) } },
          UpdateExpression: 'SET #exp = :exp',
          ConditionExpression: 'attribute_exists(#id)',
          ExpressionAttributeNames: { '#exp': this.expAttr, '#id': this.idAttr },
          ExpressionAttributeValues: { ':exp': { N: String(Date.now() + step.expires_in_ms) } },
        }));
        return;
      case 'snapshot':
        this.vars.set(step.as, await this.readRaw(this.rawKey(step)));
        return;
      case 'expect_item': return this.expectItem(step);
      case 'expect_keys': return this.expectKeys(step);
      default: break;
    }
    let got;
    let failed = false;
    try {
      got = step.op === 'contend' ? await this.contend(step) : await this.call(step);
    } catch (e) {
      got = errorValue(e);
      failed = true;
    }
    if (!('expect' in step)) {
      if (failed) throw new Mismatch(`expected success, got ${JSON.stringify(got)}`);
      return;
    }
    const want = step.expect;
    if (want === null) {
      if (got !== null) throw new Mismatch(`expected null, got ${JSON.stringify(got)}`);
      return;
    }
    if (failed !== ('error' in want)) {
      throw new Mismatch(`expected ${JSON.stringify(want)}, got ${JSON.stringify(got)}`);
    }
    this.subset(want, got, '');
  }

  async expectItem(step) {
    const key = this.rawKey(step);
    const got = await this.readRaw(key);
    if ('same_as' in step) {
      const saved = this.vars.get(step.same_as);
      if (canon(saved) !== canon(got)) {
        throw new Mismatch(`item ${key} changed: was ${JSON.stringify(saved)}, now ${JSON.stringify(got)}`);
      }
      return;
    }
    const want = step.item;
    if (want === null || got === null) {
      if (want !== got) throw new Mismatch(`item ${key}: expected ${JSON.stringify(want)}, got ${JSON.stringify(got)}`);
      return;
    }
    const extra = Object.keys(got).filter((k) => !(k in want));
    if (extra.length > 0) {
      throw new Mismatch(`item ${key}: unexpected attribute ${extra[0]}\n  expected ${JSON.stringify(want)}\n  got ${JSON.stringify(got)}`);
    }
    this.subset(want, got, `item ${key}: `);
  }

  async expectKeys(step) {
    const keys = [];
    for await (const page of paginateScan({ client: this.client }, { TableName: this.tableName, ConsistentRead: true })) {
      keys.push(...page.Items.map((i) => i[this.idAttr].S));
    }
    const want = step.keys.map(text).sort();
    if (canon(keys.sort()) !== canon(want)) {
      throw new Mismatch(`stored keys ${JSON.stringify(keys)}, expected ${JSON.stringify(want)}`);
    }
  }

  subset(want, got, where) {
    if (!got || typeof got !== 'object') {
      throw new Mismatch(`${where}expected ${JSON.stringify(want)}, got ${JSON.stringify(got)}`);
    }
    for (const [k, wv] of Object.entries(want)) {
      const why = this.mismatch(wv, got[k] ?? null);
      if (why) {
        throw new Mismatch(`${where}${k}: ${why}\n  expected ${JSON.stringify(want)}\n  got ${JSON.stringify(got)}`);
      }
    }
  }

  /** Why `got` does not match the expected value (a literal or a matcher), or null. */
  mismatch(want, got) {
    if (want !== null && typeof want === 'object' && !Array.isArray(want)) {
      if ('ms_from_now' in want) {
        const [lo, hi] = want.ms_from_now;
        const now = Date.now();
        return Number.isInteger(got) && now + lo <= got && got <= now + hi
          ? null : `${got} is ${got - now} ms from now, expected ${lo}..=${hi}`;
      }
      if ('any' in want) return got === null ? 'absent' : null;
      if ('one_of' in want) return want.one_of.some((o) => canon(o) === canon(got)) ? null : `${JSON.stringify(got)} is not one of ${JSON.stringify(want.one_of)}`;
      if ('unordered' in want) {
        const sorted = (l) => l.map((x) => JSON.stringify(x)).sort().join();
        return Array.isArray(got) && sorted(got) === sorted(want.unordered)
          ? null : `${JSON.stringify(got)} is not ${JSON.stringify(want.unordered)} in any order`;
      }
      if ('var' in want) {
        const [name, f] = want.var.split(/\.(.*)/s);
        const value = this.vars.get(name)?.[f];
        return canon(value) === canon(got) ? null : `${JSON.stringify(got)} is not ${want.var} (${JSON.stringify(value)})`;
      }
      if (!got || typeof got !== 'object' || canon(Object.keys(got).sort()) !== canon(Object.keys(want).sort())) {
        return `${JSON.stringify(got)} has other keys than ${JSON.stringify(want)}`;
      }
      for (const [k, wv] of Object.entries(want)) {
        const why = this.mismatch(wv, got[k] ?? null);
        if (why) return `${k}: ${why}`;
      }
      return null;
    }
    if (Array.isArray(want)) {
      if (!Array.isArray(got) || got.length !== want.length) return `${JSON.stringify(got)} is not ${JSON.stringify(want)}`;
      for (let i = 0; i < want.length; i++) {
        const why = this.mismatch(want[i], got[i] ?? null);
        if (why) return why;
      }
      return null;
    }
    return want === got ? null : `${JSON.stringify(got)} is not ${JSON.stringify(want)}`;
  }
}

if (!process.env.AWS_ENDPOINT_URL) {
  throw new Error('AWS_ENDPOINT_URL is not set: run through scripts/with-services.sh');
}
const client = new DynamoDBClient({ maxAttempts: 3 });

for (const scenario of load()) {
  test(`conformance: ${scenario.name}`, async () => {
    const run = new Run(scenario, client);
    await run.table.createTable();
    for (const [n, step] of scenario.steps.entries()) {
      try {
        await run.step(step);
      } catch (e) {
        if (e instanceof Mismatch) {
          e.message = `step ${n + 1} (${step.op}): ${e.message}\n  step: ${JSON.stringify(step)}`;
        }
        throw e;
      }
    }
  });
}
