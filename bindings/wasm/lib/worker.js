'use strict';
// The Node worker: holds up to `maxConnections` leases and runs one handler per held lease.
// Per lease: a Keeper (renewals, deadline) and the handler. Worker-wide: the orphan loop (the
// sparse index), the SQS hint loop, the batched desired-state loop, and the shutdown path
// (stop claiming, abort every handler, release every lease in parallel, hint released work).
// In session mode one session loop renews a session for everything held, aborts every handler
// at the session's deadline and opens a new epoch; shutdown ends the session with one write.
// With balance (session mode's default) each renewal reports the load, and each orphan poll
// reads every session, claims no more than the fair share and hands the excess over.
// Every schedule and verdict comes from core's worker decisions, through wasm.

const os = require('node:os');
const wasm = require('../pkg/leaselock_wasm.js');
const { clock, sleep } = require('./drive');
const { LeaseLostError, fromWasm, invalid, toRust } = require('./errors');
const { Keeper, SessionHold } = require('./keeper');
const { call, json } = require('./args');

const CLAIMING = Symbol('claiming');
/** The claim source of our own earlier epoch's work (not held back by the claim limit). */
const RECLAIM_OWN = 'reclaim own';

/** A held lease that stays: not cancelled (stopped, lost, shutting down) nor being handed over. */
const staying = (held) => held.keeper.reason === undefined && !held.handingOver;

/** A promise that the next `notify()` resolves (shared by every wait until then). */
class Notify {
  #promise;
  #resolve;
  wait() {
    this.#promise ??= new Promise((resolve) => {
      this.#resolve = resolve;
    });
    return this.#promise;
  }
  notify() {
    this.#resolve?.();
    this.#promise = undefined;
    this.#resolve = undefined;
  }
}

const NEVER = new Promise(() => {});

/** What a handler is given for one held lease. */
class Connection {
  #lease;
  #signal;

  constructor(lease, signal) {
    this.#lease = lease;
    this.#signal = signal;
  }

  get id() {
    return this.#lease.id;
  }

  get fence() {
    return this.#lease.fence;
  }

  get owner() {
    return this.#lease.owner;
  }

  get url() {
    return this.#lease.url;
  }

  get lastSeq() {
    return this.#lease.lastSeq;
  }

  get deadline() {
    return this.#lease.deadline;
  }

  get lease() {
    return this.#lease;
  }

  /** Aborts at the deadline, on STOP, on a lost lease and on shutdown; `reason` says which. */
  get signal() {
    return this.#signal;
  }

  /** Records the last processed sequence number under the lease. */
  checkpoint(seq, options) {
    return this.#lease.checkpoint(seq, options);
  }

  /** A fenced write (see `Lease.write`): `items` apply only while the lease is ours. */
  write(items, options) {
    return this.#lease.write(items, options);
  }
}

class Worker {
  #table;
  #sqs;
  #queueUrl;
  #handler;
  #settings;
  #logger;
  /** id -> CLAIMING or the held lease's { lease, keeper }. */
  #tracked = new Map();
  #tasks = new Set();
  #stopping = false;
  #shutdown = new AbortController();
  #shuttingDown = new Promise((resolve) => this.#shutdown.signal.addEventListener('abort', resolve, { once: true }));
  #wakeOrphans = new Notify();
  #roomFreed = new Notify();
  /** Session mode: the live session, the loop's stop, and whether to claim back older epochs' work. */
  #sessionMode;
  #session;
  #sessionStop = new AbortController();
  #reclaimOwn = false;
  /** Balance (session mode): core's decisions, the claim limit they set, and hand-over rounds. */
  #balance;
  #claimLimit;
  #claims = 0;
  #handOverRounds = 0;
  #handOversStarted = 0;
  #renewNow = new Notify();
  #counters = {
    sessionTakeovers: 0,
    acquired: 0,
    acquireConflicts: 0,
    acquireErrors: 0,
    leasesLost: 0,
    released: 0,
    handedOver: 0,
    handlerErrors: 0,
    orphanPolls: 0,
    hintsReceived: 0,
  };

  /**
   * @param {object} options `table` (a LeaseTable), `handler(conn, signal)` (async), and
   *   optionally `sqs` + `queueUrl` (START hints), `maxConnections`, `workerId`,
   *   `orphanIntervalMs`, `desiredStateIntervalMs`, `handlerGraceMs`, `hintWaitMs`, `logger`,
   *   and `balance` (session mode; default true).
   */
  constructor(options) {
    const { table, sqs, handler, logger, ...rest } = options ?? {};
    if (typeof table?.acquireStarted !== 'function') {
      throw invalid('table', 'a LeaseTable is required');
    }
    if (typeof handler !== 'function') {
      throw invalid('handler', 'must be an async function (conn, signal)');
    }
    if (sqs !== undefined && typeof sqs?.send !== 'function') {
      throw invalid('sqs', 'must be an SQSClient from @aws-sdk/client-sqs');
    }
    const workerId = rest.workerId ?? defaultWorkerId();
    const settings = json('options', { ...rest, workerId, hints: sqs !== undefined });
    this.#settings = JSON.parse(call(() => wasm.workerSettings(settings)));
    this.#table = table;
    this.#sqs = sqs;
    this.#queueUrl = rest.queueUrl;
    this.#handler = handler;
    this.#logger = logger ?? stderrLogger;
    this.#sessionMode = table.mode === 'session';
    this.#claimLimit = this.#settings.maxConnections;
    if (this.#sessionMode && this.#settings.balance) {
      this.#balance = new wasm.Balance(table.rules, workerId, this.#settings.orphanIntervalMs);
    }
  }

  get workerId() {
    return this.#settings.workerId;
  }

  /** Counters since start and the ids held now (sorted). */
  snapshot() {
    const held = [...this.#tracked].filter(([, t]) => t !== CLAIMING).map(([id]) => id);
    const { sessionTakeovers, ...counters } = this.#counters;
    const session = this.#sessionMode
      ? {
          sessionEpoch: this.#session?.epoch ?? null,
          sessionTakeovers,
          claimLimit: this.#balance === undefined ? null : this.#claimLimit,
        }
      : {};
    return {
      workerId: this.workerId,
      maxConnections: this.#settings.maxConnections,
      held: held.sort(),
      ...counters,
      ...session,
      stopping: this.#shutdown.signal.aborted,
    };
  }

  /** Starts the graceful shutdown that `run()` completes. */
  shutdown() {
    this.#shutdown.abort();
  }

  /**
   * Runs until SIGTERM, SIGINT, `signal` or `shutdown()`; then stops claiming, aborts every
   * handler, waits for them (at most `handlerGraceMs` each), releases every lease in parallel,
   * hints the released work, and resolves with the final snapshot.
   */
  async run({ signal } = {}) {
    const stop = () => this.shutdown();
    process.once('SIGTERM', stop);
    process.once('SIGINT', stop);
    signal?.addEventListener('abort', stop, { once: true });
    try {
      this.#logger.info?.('worker started', { workerId: this.workerId, maxConnections: this.#settings.maxConnections });
      const session = this.#sessionMode ? this.#sessionLoop() : undefined;
      const loops = [this.#orphanLoop(), this.#desiredStateLoop()];
      if (this.#sqs !== undefined) {
        loops.push(this.#hintLoop());
      }
      await this.#shuttingDown;
      const heldAtShutdown = this.snapshot().held;
      this.#stopAll();
      if (session !== undefined) {
        // The one session write frees everything, so it comes once no claim is in flight and
        // every handler has ended (not after the loops: a long poll may be pending).
        while (this.#tracked.size > 0) {
          await this.#roomFreed.wait();
        }
        this.#sessionStop.abort();
        await session;
        await this.#endSession(heldAtShutdown);
      }
      // Claims in flight still land (and are cancelled at once); then every lease task waits
      // for its handler and releases its lease, all at the same time.
      await Promise.allSettled(loops);
      while (this.#tasks.size > 0) {
        await Promise.allSettled([...this.#tasks]);
      }
      const snapshot = this.snapshot();
      this.#logger.info?.('worker stopped', { workerId: this.workerId, released: snapshot.released });
      return snapshot;
    } finally {
      process.removeListener('SIGTERM', stop);
      process.removeListener('SIGINT', stop);
      signal?.removeEventListener('abort', stop);
    }
  }

  #capacity() {
    return wasm.capacityLeft(this.#settings.maxConnections, this.#tracked.size);
  }

  /** Claims that fit now: the capacity, and with balance the claim limit too. */
  #room() {
    const capacity = this.#capacity();
    return this.#balance === undefined ? capacity : Math.min(capacity, Math.max(0, this.#claimLimit - this.#tracked.size));
  }

  /**
   * What a session renewal reports: the work held or being claimed here (not what is being
   * handed over, stopped or lost; still what a shutdown's end write is about to free: core's
   * `countsInLoad`) and `maxConnections`.
   */
  #load() {
    let held = 0;
    for (const t of this.#tracked.values()) {
      if (t === CLAIMING || wasm.countsInLoad(t.keeper.reason, t.handingOver !== 0)) {
        held += 1;
      }
    }
    return { held, maxConnections: this.#settings.maxConnections };
  }

  #stopAll() {
    this.#stopping = true;
    for (const tracked of this.#tracked.values()) {
      if (tracked !== CLAIMING) {
        tracked.keeper.cancel('Shutdown');
      }
    }
    this.#wakeOrphans.notify();
    this.#roomFreed.notify();
  }

  /**
   * Tries to claim `id`: needs capacity (and, with balance, to be below the claim limit unless
   * it is our own earlier epoch's work), must not be ours already, and the table decides.
   */
  async #claim(id, source) {
    if (this.#capacity() === 0) {
      return 'NoCapacity';
    }
    if (this.#stopping) {
      return 'Stopping';
    }
    if (this.#tracked.has(id)) {
      return 'AlreadyOurs';
    }
    if (this.#balance !== undefined && source !== RECLAIM_OWN && this.#tracked.size >= this.#claimLimit) {
      return 'NoCapacity';
    }
    const session = this.#session;
    if (this.#sessionMode && session === undefined) {
      return 'Failed';
    }
    this.#tracked.set(id, CLAIMING);
    let lease;
    try {
      lease = await (session ? session.claim(id) : this.#table.acquireStarted(id, { owner: this.workerId }));
    } catch (e) {
      this.#forget(id, CLAIMING);
      if (wasm.claimFailure(toRust(e)) === 'Conflict') {
        this.#counters.acquireConflicts += 1;
        return 'Conflict';
      }
      this.#counters.acquireErrors += 1;
      this.#logger.warn('claim failed', { connectionId: id, source, error: String(e?.message ?? e) });
      return 'Failed';
    }
    if (!wasm.isFleetWork(JSON.stringify(lease))) {
      this.#forget(id, CLAIMING);
      await lease.release().catch(() => {});
      this.#counters.acquireConflicts += 1;
      return 'Conflict';
    }
    this.#supervise(lease, session?.epoch);
    if (this.#stopping) {
      this.#tracked.get(id).keeper.cancel('Shutdown');
    }
    // The session was lost (or a new epoch began) while the claim was in flight.
    if (session && wasm.claimOutlivedSession(session.epoch, this.#session?.epoch ?? -1)) {
      this.#tracked.get(id).keeper.cancel('Deadline');
    }
    this.#counters.acquired += 1;
    this.#logger.info?.('claimed', { connectionId: id, fence: lease.fence, source });
    return 'Claimed';
  }

  #forget(id, entry) {
    if (this.#tracked.get(id) === entry) {
      this.#tracked.delete(id);
      this.#roomFreed.notify();
    }
  }

  /** One held lease: the keeper and the handler; gives the lease back once the handler ends. */
  #supervise(lease, epoch) {
    const keeper = this.#sessionMode ? new SessionHold(lease) : new Keeper(lease);
    this.#claims += 1;
    const held = { lease, keeper, epoch, claimOrder: this.#claims, handingOver: 0 };
    this.#tracked.set(lease.id, held);
    const task = this.#runLease(held).finally(() => this.#tasks.delete(task));
    this.#tasks.add(task);
  }

  async #runLease(held) {
    const { lease, keeper } = held;
    const id = lease.id;
    const conn = new Connection(lease, keeper.signal);
    const end = await this.#waitForHandler(conn, keeper.signal);
    if (end.error !== undefined) {
      this.#counters.handlerErrors += 1;
      this.#logger.warn('handler failed', { connectionId: id, error: String(end.error?.message ?? end.error) });
    } else if (end.abandoned) {
      this.#logger.warn('handler ignored its signal; releasing without it', { connectionId: id });
    }
    await keeper.stop();
    const reason = keeper.reason;
    if (wasm.countsAsLost(reason)) {
      this.#counters.leasesLost += 1;
      this.#logger.warn('lease lost', { connectionId: id, reason });
    }
    if (wasm.releasesAfterHandler(reason, this.#sessionMode)) {
      try {
        await lease.release();
        this.#counters.released += 1;
        if (reason === 'HandOver') {
          this.#counters.handedOver += 1;
        }
        const hinted = reason === 'Shutdown' || reason === 'HandOver';
        if (hinted && this.#sqs !== undefined && wasm.isFleetWork(JSON.stringify(lease))) {
          await this.#handOver(id);
        }
      } catch (e) {
        if (!(e instanceof LeaseLostError)) {
          this.#logger.warn('release failed; the lease will expire', { connectionId: id, error: String(e?.message) });
        }
      }
    }
    // Anything the handler left running with the connection stops now.
    keeper.cancel('Released');
    this.#forget(id, held);
  }

  /** Resolves when the handler settles, or `handlerGraceMs` after its signal aborted. */
  #waitForHandler(conn, signal) {
    return new Promise((resolve) => {
      let grace;
      const onAbort = () => {
        grace = setTimeout(() => resolve({ abandoned: true }), this.#settings.handlerGraceMs);
      };
      const settle = (end) => {
        clearTimeout(grace);
        signal.removeEventListener('abort', onAbort);
        resolve(end);
      };
      signal.addEventListener('abort', onAbort, { once: true });
      Promise.resolve()
        .then(() => this.#handler(conn, signal))
        .then(
          () => settle({}),
          (error) => settle(signal.aborted && error === signal.reason ? {} : { error }),
        );
    });
  }

  async #orphanLoop() {
    let failures = 0;
    while (!this.#stopping) {
      let wakeInMs;
      try {
        wakeInMs = await this.#pollOrphans();
        failures = 0;
      } catch (e) {
        failures += 1;
        this.#logger.warn('orphan query failed', { error: String(e?.message ?? e) });
        wakeInMs = wasm.orphanRetryMs(failures, this.#settings.orphanIntervalMs, Math.random());
      }
      await this.#pause(wakeInMs, this.#wakeOrphans.wait());
    }
  }

  /** Waits `ms`, or until `early` resolves or shutdown. */
  async #pause(ms, early) {
    const wake = new AbortController();
    await Promise.race([sleep(ms, wake.signal).catch(() => {}), early, this.#shuttingDown]);
    wake.abort();
  }

  /**
   * One poll: query orphans (and leases about to expire), in session mode read the sessions
   * (with balance: set the claim limit, maybe start a hand-over round), claim what fits, say
   * when to poll next.
   */
  async #pollOrphans() {
    const rules = this.#table.rules;
    const intervalMs = this.#settings.orphanIntervalMs;
    const capacity = this.#capacity();
    // Session mode polls even when full: the poll also decides the balance.
    if (capacity === 0 && !this.#sessionMode) {
      return wasm.jitteredMs(intervalMs, Math.random());
    }
    const cutoff = rules.orphanQueryCutoff(clock.now(), intervalMs);
    // With balance every orphan counts as the fleet's work, not only those that fit here.
    const pageSize = this.#balance === undefined ? Math.max(1, capacity) : this.#settings.maxConnections;
    const page = await this.#table._orphansPage(cutoff, pageSize);
    this.#counters.orphanPolls += 1;
    const nowMs = clock.now();
    // A failed read of the sessions leaves the limit as it was; the orphans are still claimed.
    let dead;
    if (this.#sessionMode && this.#session !== undefined && !this.#stopping) {
      dead = await this.#readSessions().catch((e) => {
        this.#logger.warn('reading the sessions failed', { error: String(e?.message ?? e) });
      });
    }
    const poll = JSON.stringify({
      items: page.items,
      pageWasFull: page.next !== null,
      nowMs,
      capacity: this.#capacity(),
      intervalMs,
      random: Math.random(),
      ours: [...this.#tracked.keys()],
    });
    if (this.#balance !== undefined && dead !== undefined) {
      const [unownedOrphans, inFlight] = this.#balance.orphanCounts(poll);
      const deadWork = dead.reduce((n, d) => n + d.ids.length, 0);
      this.#rebalance(unownedOrphans + deadWork, inFlight);
    }
    const plan = JSON.parse(rules.planOrphans(poll));
    await this.#claimAll(this.#inClaimOrder(plan.claim), 'orphan');
    await this.#claimDeadSessions(dead ?? []);
    return plan.wakeInMs;
  }

  /** With balance, racing claimers over one list in one order would mostly collide: shuffled. */
  #inClaimOrder(ids) {
    if (this.#balance === undefined) {
      return ids;
    }
    const shuffled = [...ids];
    for (let i = shuffled.length - 1; i > 0; i -= 1) {
      const j = Math.floor(Math.random() * (i + 1));
      [shuffled[i], shuffled[j]] = [shuffled[j], shuffled[i]];
    }
    return shuffled;
  }

  /**
   * Session mode: the dead sessions (with balance, one listing of every session, whose live
   * ones the balance keeps) and, per dead owner, its connections (the owner index) not tracked
   * here; our own earlier epochs' work too, once after a new epoch was opened.
   */
  async #readSessions() {
    let deadSessions;
    if (this.#balance === undefined) {
      deadSessions = await this.#table.sessions({ belowMs: this.#table.rules.claimCutoff(clock.now()) });
    } else {
      const all = await this.#table.sessions();
      deadSessions = JSON.parse(this.#balance.read(JSON.stringify(all), clock.now(), clock.mono()));
    }
    const reclaimOwn = this.#reclaimOwn;
    this.#reclaimOwn = false;
    const dead = [];
    for (const [owner, epoch] of JSON.parse(wasm.deadSessionOwners(JSON.stringify(deadSessions), this.workerId, reclaimOwn))) {
      const owned = await this.#table.ownedBy(owner);
      const ids = owned.map((item) => item.id).filter((id) => !this.#tracked.has(id));
      dead.push({ owner, epoch, listed: owned.length, ids });
    }
    return dead;
  }

  /** Sets the claim limit from the fleet's load and, paced, starts a hand-over round. */
  #rebalance(unowned, inFlight) {
    const load = this.#load();
    const step = JSON.parse(this.#balance.step(load.held, load.maxConnections, unowned, inFlight, clock.mono()));
    this.#claimLimit = step.claimLimit;
    if (step.handOver > 0 && !this.#stopping) {
      const ids = this.#pickHandOvers(step.handOver);
      this.#logger.info?.('above the fair share: handing over', {
        workerId: this.workerId,
        handingOver: ids.length,
        share: step.share?.mine,
        work: step.share?.work,
      });
    }
  }

  /**
   * Picks `count` held connections to hand over (core's `handOverPicks`) and asks for a session
   * renewal at once: it reports them as no longer held, and once it has landed their handlers
   * are aborted with `HandOver`; each is then released and hinted. Returns the ids.
   */
  #pickHandOvers(count) {
    const candidates = [];
    for (const [id, t] of this.#tracked) {
      if (t !== CLAIMING && staying(t)) {
        candidates.push([id, t.lease.fence, t.claimOrder]);
      }
    }
    const picks = wasm.handOverPicks(JSON.stringify(candidates), count);
    if (picks.length === 0) {
      return picks;
    }
    const round = ++this.#handOverRounds;
    for (const id of picks) {
      this.#tracked.get(id).handingOver = round;
    }
    this.#renewNow.notify();
    return picks;
  }

  /** A session renewal that read `round` has reported the picks up to it as gone: abort them. */
  #startHandOvers(round) {
    this.#handOversStarted = Math.max(this.#handOversStarted, round);
    for (const t of this.#tracked.values()) {
      if (t !== CLAIMING && t.handingOver !== 0 && t.handingOver <= round) {
        t.keeper.cancel('HandOver');
      }
    }
  }

  /** Claims `ids`, a few at a time; resolves how many were claimed. */
  async #claimAll(ids, source) {
    const queue = [...ids];
    let claimed = 0;
    const claimNext = async () => {
      while (queue.length > 0) {
        if ((await this.#claim(queue.shift(), source)) === 'Claimed') {
          claimed += 1;
        }
      }
    };
    await Promise.all(Array.from({ length: Math.min(this.#settings.claimConcurrency, queue.length) }, claimNext));
    return claimed;
  }

  /**
   * Session mode: the connections of dead sessions (`#readSessions`) are claimed like orphans
   * (within the room; our own earlier work all at once); a dead session left with none is
   * retired so later queries skip it.
   */
  async #claimDeadSessions(dead) {
    for (const { owner, epoch, listed, ids } of dead) {
      if (this.#stopping) {
        return;
      }
      if (listed === 0) {
        if (epoch !== null) {
          await this.#table._retireSession(owner, epoch);
        }
        continue;
      }
      const own = epoch === null;
      if (this.#room() === 0 && !own) {
        continue;
      }
      const claimed = await this.#claimAll(this.#inClaimOrder(ids), own ? RECLAIM_OWN : 'dead session');
      if (own && claimed < ids.length) {
        // Some of our earlier work is still listed under us: look again at the next poll.
        this.#reclaimOwn = true;
      }
      if (claimed > 0) {
        this.#logger.info?.('took over a dead session\'s work', { owner, claimed });
        this.#counters.sessionTakeovers += claimed;
      }
    }
  }

  /** Session mode: opens a session, holds it until it is lost, then opens a new epoch. */
  async #sessionLoop() {
    const rules = this.#table.rules;
    const stop = this.#sessionStop.signal;
    let previousEpoch;
    let failures = 0;
    while (!stop.aborted) {
      let session;
      try {
        session = await this.#table.createSession(this.workerId, { previousEpoch });
      } catch (e) {
        const waitMs = rules.sessionRetryMs(toRust(e), failures, clock.now(), Math.random());
        failures += 1;
        this.#logger.warn('session not opened', { workerId: this.workerId, error: String(e?.message ?? e), waitMs });
        await sleep(waitMs, stop).catch(() => {});
        continue;
      }
      failures = 0;
      previousEpoch = session.epoch;
      session._coverWhen((lease) => {
        const held = this.#tracked.get(lease.id);
        return held?.lease === lease && wasm.movesWithSession(held.epoch, held.keeper.reason, session.epoch);
      });
      this.#session = session;
      this.#logger.info?.('session opened', { workerId: this.workerId, epoch: session.epoch });
      // Work of an earlier epoch of ours is claimed back like a dead session's.
      this.#reclaimOwn = true;
      this.#wakeOrphans.notify();
      await this.#holdSession(session, stop);
    }
  }

  /**
   * Renews `session` until it is lost (then every handler is aborted) or the loop stops. Every
   * renewal reports the load; a hand-over round waiting for one renews at once.
   */
  async #holdSession(session, stop) {
    const rules = this.#table.rules;
    for (;;) {
      const deadline = session.deadline;
      if (this.#handOverRounds === this.#handOversStarted) {
        const wake = new AbortController();
        const onStop = () => wake.abort();
        stop.addEventListener('abort', onStop, { once: true });
        const due = Math.max(0, rules.sessionWakeAt(JSON.stringify(session)) - clock.mono());
        await Promise.race([sleep(due, wake.signal).catch(() => {}), this.#renewNow.wait()]);
        wake.abort();
        stop.removeEventListener('abort', onStop);
      }
      if (stop.aborted) {
        return;
      }
      const now = clock.mono();
      if (now >= deadline) {
        break;
      }
      // The round first: a pick made after the load was read waits for the next renewal.
      const round = this.#handOverRounds;
      // Reported with or without balance here, as core's worker does: peers count it.
      const load = this.#load();
      // Rule 2: nothing runs past the deadline, a renewal stuck in the network included.
      try {
        await session.renew({ signal: AbortSignal.timeout(Math.max(1, Math.ceil(deadline - now))), load });
        this.#startHandOvers(round);
      } catch (e) {
        this.#logger.warn('session lost', { workerId: this.workerId, epoch: session.epoch, error: String(e?.message ?? e) });
        break;
      }
    }
    this.#session = undefined;
    for (const tracked of this.#tracked.values()) {
      if (tracked !== CLAIMING) {
        tracked.keeper.cancel('Deadline');
      }
    }
  }

  /** Session mode's graceful end: one write frees everything held; the work is hinted. */
  async #endSession(ids) {
    const session = this.#session;
    if (session === undefined) {
      return;
    }
    try {
      // The end reports what it frees: a peer at its share counts it when the hints arrive.
      await session.end({ load: { held: ids.length, maxConnections: this.#settings.maxConnections } });
      this.#logger.info?.('session ended', { workerId: this.workerId, epoch: session.epoch });
    } catch (e) {
      this.#logger.warn('session end failed; it will expire', { workerId: this.workerId, error: String(e?.message ?? e) });
    }
    this.#session = undefined;
    if (this.#sqs !== undefined) {
      await Promise.all(ids.map((id) => this.#handOver(id)));
    }
  }

  /** Every interval, one batched read of the desired state of every held lease; STOPPED aborts. */
  async #desiredStateLoop() {
    const intervalMs = this.#settings.desiredStateIntervalMs;
    // A random phase spreads a fleet's reads; after it the period is exact.
    let next = clock.mono() + wasm.desiredStatePhaseMs(intervalMs, Math.random());
    while (!this.#stopping) {
      await this.#pause(Math.max(0, next - clock.mono()), NEVER);
      if (this.#stopping) {
        return;
      }
      next = Math.max(next + intervalMs, clock.mono());
      const held = new Map([...this.#tracked].filter(([, t]) => t !== CLAIMING));
      if (held.size === 0) {
        continue;
      }
      try {
        const states = await this.#table.desiredStates([...held.keys()]);
        for (const id of wasm.stoppedIds(JSON.stringify(Object.fromEntries(states)))) {
          held.get(id)?.keeper.cancel('Stopped');
        }
      } catch (e) {
        this.#logger.warn('desired-state check failed', { held: held.size, error: String(e?.message ?? e) });
      }
    }
  }

  async #hintLoop() {
    const { ReceiveMessageCommand } = require('@aws-sdk/client-sqs');
    const waitMs = this.#settings.hintWaitMs;
    let failures = 0;
    while (!this.#stopping) {
      // Only take hints while there is room: a full worker leaves them to the others. One at its
      // fair share still reads them: the orphan poll they wake sets the share from the new work,
      // and what is past it is given back at once.
      if (this.#capacity() === 0) {
        await this.#pause(waitMs, this.#roomFreed.wait());
        continue;
      }
      // A long poll is not abandoned at shutdown: SQS may still hand messages to a poll whose
      // client has gone, and they would stay invisible for the visibility timeout. It runs out
      // (at most `hintWaitMs`) and what it brings is given back at once.
      let messages;
      try {
        const receive = new ReceiveMessageCommand({
          QueueUrl: this.#queueUrl,
          MaxNumberOfMessages: wasm.hintBatchSize(Math.max(1, this.#room())),
          WaitTimeSeconds: Math.round(waitMs / 1000),
        });
        const margin = this.#settings.pollAnswerMarginMs;
        const out = await this.#sqs.send(receive, { abortSignal: AbortSignal.timeout(waitMs + margin) });
        failures = 0;
        messages = out.Messages ?? [];
      } catch (e) {
        failures += 1;
        const delay = wasm.hintRetryMs(failures, Math.random());
        this.#logger.warn('hint receive failed', { error: String(e?.message ?? e), retryInMs: delay });
        await this.#pause(delay, NEVER);
        continue;
      }
      if (messages.length === 0) {
        continue;
      }
      this.#counters.hintsReceived += messages.length;
      // Hints come in tens: one index query finds all the work they point at. At the fair share,
      // one read of the sessions first says whether the share has grown (a peer left).
      this.#wakeOrphans.notify();
      if (this.#balance !== undefined && this.#tracked.size >= this.#claimLimit) {
        await this.#refreshClaimLimit();
      }
      const outcomes = await Promise.all(
        messages.map(async (m) => {
          let id;
          try {
            id = wasm.hintConnectionId(m.Body ?? '');
          } catch (thrown) {
            this.#logger.warn('unreadable hint dropped', { messageId: m.MessageId, error: fromWasm(thrown).message });
            return [m, 'Failed'];
          }
          return [m, await this.#claim(id, 'hint')];
        }),
      );
      await this.#settle(outcomes);
    }
  }

  /**
   * Raises the claim limit to what one listing of every session allows now (a peer that ended
   * or died counts what it last reported); never lowers it: the next orphan poll sets it from
   * the whole view. A failed or slow read (past one orphan interval) leaves it as it was.
   */
  async #refreshClaimLimit() {
    let all;
    try {
      all = await this.#table.sessions({ signal: AbortSignal.timeout(this.#settings.orphanIntervalMs) });
    } catch (e) {
      this.#logger.warn('reading the sessions failed', { error: String(e?.message ?? e) });
      return;
    }
    const load = this.#load();
    const limit = this.#balance.refreshedLimit(JSON.stringify(all), load.held, load.maxConnections, clock.now());
    this.#claimLimit = Math.max(this.#claimLimit, limit);
  }

  /** Deletes every handled hint; one this worker had no room for is made visible again at once. */
  async #settle(outcomes) {
    const { DeleteMessageBatchCommand, ChangeMessageVisibilityBatchCommand } = require('@aws-sdk/client-sqs');
    const remove = [];
    const giveBack = [];
    outcomes.forEach(([m, outcome], i) => {
      if (m.ReceiptHandle === undefined) {
        return;
      }
      if (outcome === 'NoCapacity' || outcome === 'Stopping') {
        giveBack.push({ Id: String(i), ReceiptHandle: m.ReceiptHandle, VisibilityTimeout: 0 });
      } else {
        remove.push({ Id: String(i), ReceiptHandle: m.ReceiptHandle });
      }
    });
    try {
      if (remove.length > 0) {
        await this.#sqs.send(new DeleteMessageBatchCommand({ QueueUrl: this.#queueUrl, Entries: remove }));
      }
      if (giveBack.length > 0) {
        await this.#sqs.send(new ChangeMessageVisibilityBatchCommand({ QueueUrl: this.#queueUrl, Entries: giveBack }));
      }
    } catch (e) {
      this.#logger.warn('hint settle failed', { error: String(e?.message ?? e) });
    }
  }

  /** Hints work released on shutdown, so another worker claims it at once. Best effort. */
  async #handOver(id) {
    const { SendMessageCommand } = require('@aws-sdk/client-sqs');
    try {
      const message = new SendMessageCommand({ QueueUrl: this.#queueUrl, MessageBody: wasm.hintBody(id) });
      await this.#sqs.send(message, { abortSignal: AbortSignal.timeout(this.#settings.handOverTimeoutMs) });
    } catch (e) {
      this.#logger.warn('hand-over hint failed', { connectionId: id, error: String(e?.message ?? e) });
    }
  }
}

/** host-pid-random: unique per process, and readable in the table. */
function defaultWorkerId() {
  const suffix = Math.floor(Math.random() * 0x1000000)
    .toString(16)
    .padStart(6, '0');
  return `${os.hostname() || 'worker'}-${process.pid}-${suffix}`;
}

const stderrLogger = {
  warn(message, fields) {
    process.stderr.write(`${JSON.stringify({ level: 'WARN', message, ...fields })}\n`);
  },
};

module.exports = { Worker, Connection, defaultWorkerId };
