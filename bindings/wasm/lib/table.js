'use strict';
// LeaseTable and Lease: each method converts its arguments, builds the protocol operation in
// wasm and drives it with the caller's DynamoDBClient.

const wasm = require('../pkg/leaselock_wasm.js');
const { drive, sleep, Serial, TableClock } = require('./drive');
const { send } = require('./io');
const { LeaseLostError, invalid } = require('./errors');
const { call, count, json, text } = require('./args');
const { Keeper, abortReason } = require('./keeper');
const { Session } = require('./session');

const asyncDispose = Symbol.asyncDispose ?? Symbol.for('Symbol.asyncDispose');

/** `promise`, or the signal's reason as soon as it aborts. */
function abortable(promise, signal) {
  signal.throwIfAborted();
  return new Promise((resolve, reject) => {
    const onAbort = () => reject(signal.reason);
    signal.addEventListener('abort', onAbort, { once: true });
    promise.then(resolve, reject).finally(() => signal.removeEventListener('abort', onAbort));
  });
}

/** Lease operations on one DynamoDB table, through the caller's `DynamoDBClient`. */
class LeaseTable {
  #rules;
  /** The table check in flight or passed (see `checkTable`). */
  #checked;

  /**
   * @param {object} options `client` (a DynamoDBClient), `tableName`, and optionally `leaseMs`,
   *   `renewMs`, `clockSkewMs`, `keyPrefix`, `indexName`, `attributeNames`, `mode` ("per-item",
   *   the default, or "session": one session item per worker renewed for everything it holds;
   *   "item" is the older spelling of "per-item", still accepted),
   *   `orphanShards` (1 to 256, default 1: running work over `STARTED#0..N-1`),
   *   `allowEventualGlobalTable` (default false: see `checkTable`).
   */
  constructor(options) {
    const { client, ...rest } = options ?? {};
    if (typeof client?.send !== 'function') {
      throw invalid('client', 'a DynamoDBClient from @aws-sdk/client-dynamodb is required');
    }
    this.client = client;
    this.#rules = call(() => new wasm.Table(json('options', rest)));
    /**
     * The table's clock: the store's, measured from every answer's `date` header and applied
     * to the wall clock once known within half the clock skew (see `measureClock`).
     */
    this.clock = new TableClock(this.#rules.clockSkewMs / 2);
  }

  get tableName() {
    return this.#rules.tableName;
  }

  get leaseMs() {
    return this.#rules.leaseMs;
  }

  get renewMs() {
    return this.#rules.renewMs;
  }

  get clockSkewMs() {
    return this.#rules.clockSkewMs;
  }

  /** "per-item" or "session" (the CLI's names). */
  get mode() {
    return this.#rules.mode;
  }

  /** How many orphan-index partition values running work is spread over (1: unsharded). */
  get orphanShards() {
    return this.#rules.orphanShards;
  }

  /** Whether a global table in multi-Region eventual consistency is accepted (see `checkTable`). */
  get allowEventualGlobalTable() {
    return this.#rules.allowEventualGlobalTable;
  }

  /** The decisions that depend on this table's settings (the worker and the keeper use them). */
  get rules() {
    return this.#rules;
  }

  async #run(makeOp, signal, appendItems) {
    signal?.throwIfAborted();
    return drive(call(makeOp), this.client, signal, appendItems, this.clock);
  }

  /** A claim: its arguments checked first, then the table (once), then the claim itself. */
  async #claim(makeOp, signal) {
    signal?.throwIfAborted();
    const op = call(makeOp);
    try {
      await this.checkTable({ signal });
    } catch (e) {
      op.free();
      throw e;
    }
    return drive(op, this.client, signal, undefined, this.clock);
  }

  /**
   * Whether leases on this table can be exclusive, asked once per LeaseTable before its first
   * claim (`acquire`, `using`, a Worker's or an elector's start): resolves
   * `{ kind: 'single-region' }`, `{ kind: 'strong', regions }` (a global table in multi-Region
   * strong consistency) or `{ kind: 'not-checked' }` (`allowEventualGlobalTable`: nothing is
   * sent). A global table in multi-Region eventual consistency, where writes in two Regions
   * resolve last-writer-wins, rejects with InvalidInputError (field `table`); a missing table
   * with TableNotFoundError. One DescribeTable; a success is kept, a failure is asked again.
   */
  async checkTable({ signal } = {}) {
    signal?.throwIfAborted();
    if (this.#checked === undefined) {
      // Not tied to one caller's signal: the callers waiting for it may differ.
      const checked = drive(call(() => this.#rules.checkTable()), this.client, undefined, undefined, this.clock);
      this.#checked = checked;
      checked.catch(() => {
        if (this.#checked === checked) {
          this.#checked = undefined;
        }
      });
    }
    return signal === undefined ? this.#checked : abortable(this.#checked, signal);
  }

  /**
   * The store's clock against this host's as measured so far from the table's answers:
   * `{ offsetMs, uncertaintyMs, samples }` (offset: the store's clock minus this host's), or
   * undefined before any answer.
   */
  clockEstimate() {
    return this.clock.estimate();
  }

  /**
   * Measures the store's clock until it is known within `withinMs` (default half the clock
   * skew): at most 12 DescribeTable requests (no capacity used), each sent when its answer
   * narrows the estimate most, about one a second. Resolves `clockEstimate()`.
   */
  async measureClock({ withinMs = this.clockSkewMs / 2, signal } = {}) {
    let roundTripMs = 10;
    for (let probe = 0; probe < 12; probe++) {
      const known = this.clock.estimate();
      if (known !== undefined && known.uncertaintyMs <= withinMs) {
        break;
      }
      await sleep(Math.max(0, this.clock.probeAt(roundTripMs) - this.clock.mono()), signal);
      const sent = this.clock.mono();
      const input = { TableName: this.tableName };
      await send(this.client, 'DescribeTable', input, 2_000, signal, undefined, this.clock.attempt);
      roundTripMs = Math.min(500, Math.max(1, Math.round(this.clock.mono() - sent)));
    }
    return this.clock.estimate();
  }

  /** Creates the table, its indexes and TTL when missing, and waits until they are active. */
  async createTable({ signal } = {}) {
    await this.#run(() => this.#rules.createTable(), signal);
  }

  /** Marks `id` STARTED with its `url` (idempotent; an owner keeps its lease). Resolves the item. */
  async start(id, url, { signal } = {}) {
    return this.#run(() => this.#rules.start(text('id', id), text('url', url)), signal);
  }

  /** Marks `id` STOPPED; rejects with LeaseNotFoundError when it has no item. */
  async stop(id, { signal } = {}) {
    return this.#run(() => this.#rules.stop(text('id', id), this.clock.now()), signal);
  }

  /**
   * Claims the lease on `id` for `owner` if nobody holds it (the item is created when missing);
   * LeaseHeldError names the holder, LeaseStoppedError refuses stopped work.
   */
  async acquire(id, { owner, signal } = {}) {
    const data = await this.#claim(() => this.#rules.acquire(text('id', id), text('owner', owner)), signal);
    return new Lease(this, data);
  }

  /** The fleet's claim: only an existing item whose desired state is STARTED. */
  async acquireStarted(id, { owner, signal } = {}) {
    const data = await this.#claim(() => this.#rules.acquireStarted(text('id', id), text('owner', owner)), signal);
    return new Lease(this, data);
  }

  /** A strongly consistent read; `null` when `id` has no item. */
  async get(id, { signal } = {}) {
    return this.#run(() => this.#rules.get(text('id', id)), signal);
  }

  /**
   * STARTED items nobody holds (expiry older than now minus the clock skew, or `cutoffMs`),
   * oldest first, read `pageSize` (default 1000) at a time, at most `limit`.
   */
  async orphans({ limit, cutoffMs, pageSize = 1000, signal } = {}) {
    const max = limit === undefined ? -1 : count('limit', limit);
    const cutoff = cutoffMs === undefined ? -1 : count('cutoffMs', cutoffMs);
    const size = count('pageSize', pageSize);
    return this.#run(() => this.#rules.orphans(cutoff, max, size), signal);
  }

  /** Internal: one page of orphans below `cutoffMs` (the worker's poll). */
  async _orphansPage(cutoffMs, pageSize, signal) {
    return this.#run(() => this.#rules.orphansPage(cutoffMs, pageSize), signal);
  }

  /** The desired state of every id: a Map from id to "STARTED", "STOPPED" or null. */
  async desiredStates(ids, { signal } = {}) {
    if (!Array.isArray(ids)) {
      throw invalid('ids', 'must be an array of strings');
    }
    ids.forEach((id) => text('id', id));
    const states = await this.#run(() => this.#rules.desiredStates(json('ids', ids)), signal);
    return new Map(Object.entries(states));
  }

  /** The items whose lease `owner` holds now. */
  async ownedBy(owner, { signal } = {}) {
    return this.#run(() => this.#rules.ownedBy(text('owner', owner)), signal);
  }

  /** Every item under the key prefix. */
  async items({ signal } = {}) {
    return this.#run(() => this.#rules.items(), signal);
  }

  /**
   * Claims `id`, runs `routine(lease, signal)`, renews in the background on the protocol's
   * schedule, aborts `signal` (its reason says why) at the deadline, on a lost lease or on STOP,
   * and resolves with the routine's result. When the routine settles the lease is released
   * unless it was lost (someone else's now) or the routine released it; after the deadline, on
   * STOP or when the routine threw it is released too (the write is conditional on owner and
   * fence), as Python's `with table.hold()` does.
   */
  async using(id, options, routine) {
    if (typeof options === 'function') {
      [options, routine] = [{}, options];
    }
    if (typeof routine !== 'function') {
      throw invalid('routine', 'must be a function (lease, signal) => Promise');
    }
    const { owner, signal } = options ?? {};
    const lease = await this.acquire(id, { owner, signal });
    const keeper = new Keeper(lease, signal);
    let result;
    try {
      result = await routine(lease, keeper.signal);
    } finally {
      await keeper.stop();
      // As every scope's exit (Python's `with table.hold()` too): released unless lost (core's
      // shouldRelease) or released by the routine already.
      if (wasm.shouldRelease(keeper.reason)) {
        await lease[asyncDispose]();
      }
    }
    return result;
  }

  /**
   * Session mode: opens a new epoch of `owner`'s session. LeaseHeldError while a session of
   * `owner` lives, unless `previousEpoch` is the epoch this owner held and stopped acting for.
   */
  async createSession(owner, { previousEpoch, signal } = {}) {
    if (this.mode !== 'session') {
      throw invalid('mode', 'sessions need a table with mode: "session"');
    }
    const previous = previousEpoch === undefined || previousEpoch === null ? -1 : count('previousEpoch', previousEpoch);
    const data = await this.#run(() => this.#rules.createSession(text('owner', owner), previous), signal);
    return new Session(this, data);
  }

  /** Session items `{ owner, epoch, expiresAtMs }` (expiry 0: ended), oldest expiry first. */
  async sessions({ belowMs, signal } = {}) {
    const below = belowMs === undefined ? -1 : count('belowMs', belowMs);
    return this.#run(() => this.#rules.sessions(below), signal);
  }

  /** Internal: the session operations, given the session's data. */
  /** `load` (`{ held, maxConnections }`, optional) is reported in the same write. */
  async _renewSession(data, signal, load) {
    const report = load === undefined ? undefined : JSON.stringify(load);
    return this.#run(() => this.#rules.renewSession(JSON.stringify(data), report), signal);
  }

  async _endSession(data, signal, load) {
    const report = load === undefined ? undefined : JSON.stringify(load);
    return this.#run(() => this.#rules.endSession(JSON.stringify(data), report), signal);
  }

  async _retireSession(owner, epoch, signal) {
    return this.#run(() => this.#rules.retireSession(text('owner', owner), epoch), signal);
  }

  async _claimInSession(id, session, data, signal) {
    const lease = await this.#run(() => this.#rules.claimInSession(text('id', id), JSON.stringify(data)), signal);
    return new Lease(this, lease, session);
  }

  /** Internal: the operations on a held lease, given its data. */
  async _renew(data, signal) {
    return this.#run(() => this.#rules.renew(JSON.stringify(data)), signal);
  }

  async _checkpoint(data, seq, signal) {
    return this.#run(() => this.#rules.checkpoint(JSON.stringify(data), count('seq', seq)), signal);
  }

  async _release(data, signal) {
    return this.#run(() => this.#rules.release(JSON.stringify(data)), signal);
  }

  async _write(data, writes, seq, signal) {
    if (!Array.isArray(writes)) {
      throw invalid('writes', 'must be an array of TransactWriteItems entries');
    }
    const token = crypto.randomUUID();
    const checkpoint = seq === undefined ? -1 : count('checkpoint', seq);
    const op = () => this.#rules.fencedWrite(JSON.stringify(data), this.clock.now(), checkpoint, writes.length, token);
    return this.#run(op, signal, writes);
  }
}

/**
 * A held lease. `deadline` is when the owner must stop acting for it, as a `performance.now()`
 * reading (ms), whatever DynamoDB says; `timeLeft()` the ms from now until then. Operations on
 * one lease run one at a time.
 */
class Lease {
  #table;
  #data;
  #session;
  #serial = new Serial();
  #released = false;
  /** Session mode: core's holder machine of the lease, covered and ended by its session. */
  #holder;
  /** Session mode: aborted with the holder's first cancellation (see `signal`). */
  #controller;
  /** Session mode: the CancelReason `signal` aborted for. */
  #reason;
  /** Session mode: wakes the holder machine at its deadline. */
  #timer;
  /** Session mode: stops following the caller's signal. */
  #unfollow;

  constructor(table, data, session) {
    this.#table = table;
    this.#data = data;
    this.#session = session;
    if (session !== undefined) {
      const seed = Math.floor(Math.random() * 2 ** 52);
      this.#holder = new wasm.HolderMachine(table.rules, JSON.stringify(data), 'session', seed, table.clock.mono());
      this.#controller = new AbortController();
      this.#schedule();
    }
  }

  /** Session mode: the session the lease is held under (undefined for a per-item lease). */
  get session() {
    return this.#session;
  }

  /**
   * Session mode: aborts when the lease stops: at its deadline, when its session is lost or
   * ended, when it is released, and when the signal given to `Session.claim` aborts (with that
   * signal's reason; the lease stays covered by the session while its holder winds down), as
   * `using()`'s signal does. Undefined for a per-item lease.
   */
  get signal() {
    return this.#controller?.signal;
  }

  /** Session mode: the CancelReason `signal` aborted for, undefined while it has not. */
  get cancelReason() {
    return this.#reason;
  }

  /**
   * Internal (Session.claim): the caller's `outer` signal cancels the lease as it does
   * `using()`'s (`Shutdown`, aborting `signal` with its reason).
   */
  _follow(outer) {
    if (outer === undefined || this.#holder === undefined) {
      return;
    }
    const forward = () => {
      this.#abortWith(outer.reason, 'Shutdown');
      this.#tell((h, now) => h.cancel('Shutdown', now));
    };
    if (outer.aborted) {
      forward();
      return;
    }
    outer.addEventListener('abort', forward, { once: true });
    this.#unfollow = () => outer.removeEventListener('abort', forward);
  }

  #abortWith(error, reason) {
    if (this.#controller === undefined || this.#controller.signal.aborted) {
      return;
    }
    this.#reason = reason;
    this.#controller.abort(error);
  }

  /**
   * Internal: the session was renewed; the lease acts until its new deadline (a worker's
   * connection, which has no holder machine here, is moved by the worker engine's word).
   */
  _cover(deadline) {
    if (this.#holder !== undefined) {
      this.#tell((h, now) => h.cover(deadline, now));
    } else if (this.#session === undefined && !this.#released && deadline > this.#data.deadline) {
      this.#data = { ...this.#data, deadline };
    }
  }

  /**
   * Internal: the session it was held under is over, `lost` or ended: the holder machine stops
   * the lease, its deadline passes now, so nothing acts for it, and operations on it are refused
   * without a request.
   */
  _sessionOver(lost) {
    this.#tell((h, now) => (lost ? h.sessionLost(now) : h.sessionEnded(now)));
    // Lost or ended with its session, nothing is left to release.
    this.#released = true;
    this.#data = { ...this.#data, deadline: 0 };
  }

  /** Feeds the lease's holder machine and does what it says. */
  #tell(input) {
    const holder = this.#holder;
    if (holder === undefined) {
      return;
    }
    input(holder, this.#table.clock.mono());
    for (let o = holder.pollOutput(); o !== undefined; o = holder.pollOutput()) {
      const out = JSON.parse(o);
      if (out.output === 'covered') {
        this.#data = { ...this.#data, deadline: out.deadline_mono_ms };
      } else if (out.output === 'cancel') {
        this.#abortWith(abortReason(out.reason, this.id), out.reason);
      } else if (out.output === 'over') {
        // Past its deadline, it is still released at the end as any lease (conditionally).
        this.#drop();
        return;
      }
    }
    this.#schedule();
  }

  /** Wakes the holder machine when it is due (its deadline), without keeping the process alive. */
  #schedule() {
    clearTimeout(this.#timer);
    const at = this.#holder?.pollTimeout();
    if (at === undefined) {
      return;
    }
    const wake = () => this.#tell((h, now) => h.handleTimeout(now));
    this.#timer = setTimeout(wake, Math.max(0, Math.ceil(at - this.#table.clock.mono())));
    this.#timer.unref?.();
  }

  #drop() {
    this.#holder?.free();
    this.#holder = undefined;
    clearTimeout(this.#timer);
    this.#unfollow?.();
    this.#unfollow = undefined;
  }

  get table() {
    return this.#table;
  }

  get id() {
    return this.#data.id;
  }

  get owner() {
    return this.#data.owner;
  }

  get fence() {
    return this.#data.fence;
  }

  get expiresAtMs() {
    return this.#data.expiresAtMs;
  }

  get lastSeq() {
    return this.#data.lastSeq;
  }

  get url() {
    return this.#data.url;
  }

  get desiredState() {
    return this.#data.desiredState;
  }

  /**
   * When the owner must stop acting for the lease: a `performance.now()` reading, ms (the instant
   * Rust's `Lease::deadline()` and Python's `lease.deadline` name on their monotonic clocks).
   * Every renewal moves it later.
   */
  get deadline() {
    return this.#data.deadline;
  }

  /** Milliseconds left before `deadline` (`deadline - performance.now()`), 0 once past. */
  timeLeft() {
    return Math.max(0, this.#data.deadline - this.#table.clock.mono());
  }

  /** The lease's data as plain JSON (what the protocol works on). */
  toJSON() {
    return { ...this.#data };
  }

  /**
   * Extends the lease; LeaseLostError when it is no longer ours or the deadline has passed.
   * Under a session, renews the session (one write for everything held under it).
   */
  renew({ signal } = {}) {
    if (this.#session !== undefined) {
      return this.#session.renew({ signal }).then(() => this);
    }
    return this.#serial.run(async () => {
      this.#data = await this.#table._renew(this.#data, signal);
      return this;
    });
  }

  /** Records the last processed sequence number; it only moves forward. */
  checkpoint(seq, { signal } = {}) {
    return this.#serial.run(async () => {
      this.#data = await this.#table._checkpoint(this.#data, seq, signal);
      return this;
    });
  }

  /** Gives the lease up at once (expiry 0); LeaseLostError when it was no longer ours. */
  release({ signal } = {}) {
    return this.#serial.run(async () => {
      await this.#table._release(this.#data, signal);
      this.#released = true;
      this.#abortWith(abortReason('Released', this.id), 'Released');
      this.#drop();
      this.#session?._forget(this);
    });
  }

  /**
   * Applies `writes` (TransactWriteItems entries: `{ Put }`, `{ Update }`, `{ Delete }`,
   * `{ ConditionCheck }`, at most 99) atomically with a check that the lease is still ours;
   * with `checkpoint`, also moves `lastSeq` to it in the same transaction.
   */
  write(writes, { checkpoint, signal } = {}) {
    return this.#serial.run(async () => {
      await this.#table._write(this.#data, writes, checkpoint, signal);
      if (checkpoint !== undefined) {
        this.#data = { ...this.#data, lastSeq: checkpoint };
      }
      return this;
    });
  }

  /** `await using lease = ...` releases it (a lease already lost or released is left alone). */
  async [asyncDispose]() {
    if (this.#released) {
      return;
    }
    await this.release().catch((e) => {
      if (!(e instanceof LeaseLostError)) {
        throw e;
      }
    });
  }
}

module.exports = { LeaseTable, Lease };
