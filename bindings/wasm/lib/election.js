'use strict';
// LeaderElector: leader, group and strategic election on the lease table, through the caller's
// DynamoDBClient. Claims, renewals and releases are the lease protocol's operations; the
// candidate registry's are the election protocol's; every time and verdict (keys, retry pauses,
// slot order, strategy picks, term boundaries, renewal schedule, minimum lease) comes from the
// wasm decisions (core's `election::decide`). This only waits, sends and runs the action.

const os = require('node:os');
const wasm = require('../pkg/leaselock_wasm.js');
const { drive, sleep, clock } = require('./drive');
const { LeaseHeldError, LeaseLostError, LeaseLockError, invalid, toRust } = require('./errors');
const { call, json, text } = require('./args');
const { LeaseTable } = require('./table');

/** A unique owner per process: host, pid and a random tail (two electors in one process differ). */
function defaultOwner() {
  return `${os.hostname()}-${process.pid}-${Math.random().toString(36).slice(2, 8)}`;
}

/** Resolves at monotonic time `at`, or as soon as any of `signals` aborts. */
function until(at, ...signals) {
  const live = signals.filter(Boolean);
  return new Promise((resolve) => {
    if (live.some((s) => s.aborted)) {
      resolve();
      return;
    }
    const done = () => {
      clearTimeout(timer);
      live.forEach((s) => s.removeEventListener('abort', done));
      resolve();
    };
    const timer = setTimeout(done, Math.max(0, at - clock.mono()));
    live.forEach((s) => s.addEventListener('abort', done, { once: true }));
  });
}

function skipped(holder) {
  return { led: false, skipped: true, holder: holder ?? null };
}

/** Runs actions only while this process holds an election lease (same keys as Rust and Python). */
class LeaderElector {
  #table;
  #rules;

  /**
   * @param {object} options `table` (a LeaseTable) or `client` + `tableName` (and optionally
   *   `leaseMs`, `renewMs`, `clockSkewMs`, `allowEventualGlobalTable`); `owner` (unique per
   *   process; default host-pid-random),
   *   `waitMs` (0: one try), `minLeaseMs`, `keyPrefix` (of the election keys), `retryDelayMs`
   *   (200), `termMs` and `candidateTtlMs` (strategic elections; default the lease).
   */
  constructor(options) {
    const {
      table,
      client,
      tableName,
      leaseMs,
      renewMs,
      clockSkewMs,
      allowEventualGlobalTable,
      owner = defaultOwner(),
      ...rest
    } = options ?? {};
    if (table !== undefined) {
      if (!(table instanceof LeaseTable)) {
        throw invalid('table', 'must be a LeaseTable');
      }
      this.#table = table;
    } else {
      this.#table = new LeaseTable({ client, tableName, leaseMs, renewMs, clockSkewMs, allowEventualGlobalTable });
    }
    this.#rules = call(() => new wasm.ElectionRules(json('options', { owner, ...rest }), this.#table.rules));
  }

  get owner() {
    return this.#rules.owner;
  }

  get table() {
    return this.#table;
  }

  /** The key of the leader lease of `name` (`{keyPrefix}leader/{name}`). */
  leaderKey(name) {
    return call(() => this.#rules.leaderKey(text('name', name)));
  }

  /**
   * Runs `action(term, signal)` only if this process becomes the leader of `name` within the
   * wait. `signal` aborts at the local deadline (or when the lease is lost). Resolves
   * `{ led: true, fence, value, end }` or `{ skipped: true, holder }`. Every election checks the
   * table first (`LeaseTable.checkTable`, once per table).
   */
  async runIfLeader(name, action, { signal } = {}) {
    checkAction(action);
    const key = call(() => this.#rules.leaderKey(text('name', name)));
    await this.#table.checkTable({ signal });
    const claimed = await this.#claimWithin(() => this.#claim(key, signal), this.#rules.waitMs, signal);
    return claimed.lease ? this.#hold(claimed, action, null, signal) : skipped(claimed.holder);
  }

  /** Runs `action` only if this process gets one of the `slots` slots of the group `name`. */
  async runIfSlot(name, slots, action, { signal } = {}) {
    checkAction(action);
    const key = call(() => this.#rules.groupKey(text('name', name)));
    call(() => this.#rules.slotOrder(key, slots, 0));
    await this.#table.checkTable({ signal });
    const claim = async () => {
      let held;
      for (const id of this.#rules.slotOrder(key, slots, Math.random())) {
        try {
          return await this.#claim(id, signal);
        } catch (e) {
          if (!(e instanceof LeaseHeldError)) {
            throw e;
          }
          held ??= e;
        }
      }
      throw held;
    };
    const claimed = await this.#claimWithin(claim, this.#rules.waitMs, signal);
    return claimed.lease ? this.#hold(claimed, action, null, signal) : skipped(claimed.holder);
  }

  /**
   * Strategic election: registers `candidate` (`{ score, load, metadata }`, under this
   * elector's owner) while the call runs; only when `strategy` (`'HighestScore'`,
   * `'LeastLoaded'` or `{ preferredNode: id }`) picks it does it compete for the leader lease of
   * `name`. The leader asks the strategy again at every term boundary and steps down (its signal
   * aborts, the lease is released) when a better candidate has appeared.
   */
  async runIfElected(name, candidate, strategy, action, { signal } = {}) {
    checkAction(action);
    const rules = this.#rules;
    const election = call(() => rules.candidatesKey(text('name', name)));
    const key = call(() => rules.leaderKey(text('name', name)));
    const strategyJson = json('strategy', strategy);
    call(() => rules.checkStrategy(strategyJson));
    const entry = call(() => rules.candidate(json('candidate', candidate ?? {})));
    const ttl = rules.candidateTtlMs;
    const table = this.#table;
    await table.checkTable({ signal });
    await drive(call(() => table.rules.registerCandidate(election, entry, ttl)), table.client, signal, undefined, table.clock);
    const stopHeartbeat = new AbortController();
    const heartbeat = (async () => {
      for (;;) {
        await until(clock.mono() + ttl / 3, stopHeartbeat.signal);
        if (stopHeartbeat.signal.aborted) {
          return;
        }
        try {
          const refresh = table.rules.registerCandidate(election, entry, ttl);
          await drive(refresh, table.client, stopHeartbeat.signal, undefined, table.clock);
        } catch (e) {
          if (!stopHeartbeat.signal.aborted) {
            process.emitWarning(`candidate refresh of ${election} failed: ${e.message}`);
          }
        }
      }
    })();
    const list = () => drive(table.rules.listCandidates(election), table.client, signal, undefined, table.clock);
    try {
      const waitUntil = clock.mono() + rules.waitMs;
      for (;;) {
        const listed = JSON.stringify(await list());
        if (rules.competes(strategyJson, listed)) {
          const claimed = await this.#claimWithin(() => this.#claim(key, signal), 0, signal);
          if (claimed.lease) {
            const stepDown = { strategyJson, list, termMs: rules.termMs };
            return await this.#hold(claimed, action, stepDown, signal);
          }
        }
        const delay = rules.retryPauseMs(Math.random());
        if (!rules.retryWithinWait(clock.mono(), delay, waitUntil)) {
          return skipped(rules.pick(strategyJson, listed));
        }
        await sleep(delay, signal);
      }
    } finally {
      stopHeartbeat.abort();
      await heartbeat;
      const withdraw = table.rules.withdrawCandidate(election, rules.owner);
      await drive(withdraw, table.client, undefined, undefined, table.clock).catch((e) => {
        process.emitWarning(`candidate withdrawal from ${election} failed: ${e.message}`);
      });
    }
  }

  async #claim(id, signal) {
    const sentMono = clock.mono();
    const lease = await this.#table.acquire(id, { owner: this.#rules.owner, signal });
    return { lease, sentMono };
  }

  /** Claims until it lands or the wait is over (`{ holder }` then); other errors reject. */
  async #claimWithin(claim, waitMs, signal) {
    const waitUntil = clock.mono() + waitMs;
    for (;;) {
      try {
        return await claim();
      } catch (e) {
        if (!(e instanceof LeaseHeldError)) {
          throw e;
        }
        const delay = this.#rules.retryPauseMs(Math.random());
        if (!this.#rules.retryWithinWait(clock.mono(), delay, waitUntil)) {
          return { holder: e.owner };
        }
        await sleep(delay, signal);
      }
    }
  }

  /**
   * Runs the action under the claimed lease, renewing it; ends the term at the deadline, on a
   * lost renewal or (strategic) at a term boundary; then keeps the minimum lease or releases.
   */
  async #hold({ lease, sentMono }, action, stepDown, outer) {
    const rules = this.#rules;
    const term = new Term(lease);
    const claimStore = rules.claimStoreMs(lease.expiresAtMs);
    const stopping = new AbortController();
    let renewed = () => {};
    const keeper = this.#keep(lease, term, sentMono, stepDown, stopping.signal, () => renewed());
    // The caller's signal ends the action early; the lease is then kept or released as usual.
    const forward = () => term._end('Aborted', outer.reason);
    outer?.addEventListener('abort', forward, { once: true });
    let value;
    let failure;
    let end;
    // The minimum lease counts from the action's start (the claim's answer is in), so two runs
    // are never closer than it whatever the claim's latency.
    const startedMono = clock.mono();
    const startedStore = claimStore + (startedMono - sentMono);
    const work = (async () => {
      try {
        value = await action(term, term.signal);
      } catch (e) {
        failure = e;
      }
    })();
    end = await Promise.race([work.then(() => undefined), keeper]);
    if (end !== undefined) {
      await work;
    } else {
      // The minimum lease: keep renewing until the stored expiry covers it (then leave the
      // lease to run out) or until it has passed (then release).
      let release = false;
      for (;;) {
        const step = JSON.parse(rules.minLease(startedMono, clock.mono(), lease.expiresAtMs, startedStore));
        if (step.step !== 'WaitUntil') {
          release = step.step === 'Release';
          break;
        }
        const changed = new Promise((resolve) => {
          renewed = resolve;
        });
        const woke = await Promise.race([until(step.at), changed.then(() => 'renewed'), keeper]);
        if (woke !== undefined && woke !== 'renewed') {
          end = woke;
          break;
        }
      }
      if (end === undefined) {
        stopping.abort();
        await keeper;
        if (release) {
          await this.#release(lease);
        }
        end = 'Finished';
      }
    }
    stopping.abort();
    await keeper;
    outer?.removeEventListener('abort', forward);
    term._end(end === 'Finished' ? 'Released' : end);
    if (end === 'SteppedDown') {
      await this.#release(lease);
    }
    if (failure !== undefined) {
      throw failure;
    }
    return { led: true, skipped: false, fence: lease.fence, value, end };
  }

  async #release(lease) {
    await lease.release().catch((e) => {
      if (!(e instanceof LeaseLostError)) {
        process.emitWarning(`release of ${lease.id} failed (${e.message}); the lease runs out`);
      }
    });
  }

  /**
   * Renews `lease` until the term ends; resolves why it ended (`'Lost'`, `'SteppedDown'`), or
   * undefined once `stopping` aborts. The schedule, the retry policy and rule 2 are core's
   * keeper's (`LeaseKeeper`), as for every held lease.
   */
  async #keep(lease, term, sentMono, stepDown, stopping, onRenewed) {
    const rules = this.#rules;
    const keeper = rules.keeper(lease.deadline, sentMono);
    let nextTerm = stepDown ? sentMono + stepDown.termMs : Infinity;
    const lost = () => {
      term._end('Lost');
      return 'Lost';
    };
    try {
      for (;;) {
        if (stopping.aborted) {
          return undefined;
        }
        const wake = keeper.poll(clock.mono());
        if (wake === 'deadline') {
          return lost();
        }
        if (wake !== 'renew') {
          await until(Math.min(wake, nextTerm), stopping);
          if (stopping.aborted) {
            return undefined;
          }
          const now = clock.mono();
          if (now >= keeper.deadline) {
            return lost();
          }
          if (stepDown && now >= nextTerm) {
            try {
              const listed = JSON.stringify(await stepDown.list());
              if (rules.stepsDown(stepDown.strategyJson, listed)) {
                term._end('SteppedDown');
                return 'SteppedDown';
              }
            } catch (e) {
              process.emitWarning(`candidate list failed (${e.message}); staying on`);
            }
            nextTerm += stepDown.termMs;
          }
          continue;
        }
        // Rule 2: the renewal is given up at the deadline, one stuck in the network included.
        const atDeadline = AbortSignal.timeout(Math.max(1, Math.ceil(keeper.deadline - clock.mono())));
        let reason;
        try {
          await lease.renew({ signal: atDeadline });
          reason = keeper.renewedUntil(lease.deadline, rules.nextRenewAfterSuccess(lease.deadline), clock.mono(), Math.random());
          term._renewed(lease);
          onRenewed();
        } catch (e) {
          if (atDeadline.aborted) {
            return lost();
          }
          reason = keeper.failed(toRust(e), clock.mono(), Math.random());
        }
        if (reason !== undefined) {
          return lost();
        }
      }
    } finally {
      keeper.free();
    }
  }
}

function checkAction(action) {
  if (typeof action !== 'function') {
    throw invalid('action', 'must be a function (term, signal) => Promise');
  }
}

/**
 * What an elected action is handed: the fence (strictly greater than every earlier holder's of
 * this lease), the lease (for fenced writes), the slot of a group, the local deadline
 * (`performance.now()` clock), and `signal`, which aborts when the term is over.
 */
class Term {
  #lease;
  #controller = new AbortController();
  #timer;

  constructor(lease) {
    this.#lease = lease;
    this.#arm();
  }

  get fence() {
    return this.#lease.fence;
  }

  get lease() {
    return this.#lease;
  }

  get key() {
    return this.#lease.id;
  }

  get slot() {
    return wasm.slotOf(this.#lease.id) ?? null;
  }

  get deadline() {
    return this.#lease.deadline;
  }

  /** Milliseconds left before `deadline`, 0 once past. */
  timeLeft() {
    return Math.max(0, this.#lease.deadline - clock.mono());
  }

  get signal() {
    return this.#controller.signal;
  }

  /** True once the term is over: aborted, or past the local deadline (checked on the clock itself). */
  get cancelled() {
    return this.#controller.signal.aborted || clock.mono() >= this.#lease.deadline;
  }

  // The signal aborts at the deadline on its own timer, even if no renewal result ever comes.
  #arm() {
    clearTimeout(this.#timer);
    const ms = Math.max(0, Math.ceil(this.#lease.deadline - clock.mono()));
    this.#timer = setTimeout(() => this._end('Deadline'), ms);
  }

  _renewed() {
    if (!this.#controller.signal.aborted) {
      this.#arm();
    }
  }

  _end(reason, cause) {
    clearTimeout(this.#timer);
    if (this.#controller.signal.aborted) {
      return;
    }
    const id = this.#lease.id;
    // The caller's own abort keeps its reason; the end of a term says why it ended.
    const error =
      reason === 'Aborted'
        ? cause
        : reason === 'Released'
          ? Object.assign(new LeaseLockError(`term on ${id} is over`, 'Released'), { reason })
          : new LeaseLostError(`term on ${id} is over (${reason})`, { id, reason });
    this.#controller.abort(error);
  }
}

module.exports = { LeaderElector, Term };
