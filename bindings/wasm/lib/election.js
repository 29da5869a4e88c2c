'use strict';
// LeaderElector: leader, group and strategic election on the lease table, through the caller's
// DynamoDBClient. Claims, renewals and releases are the lease protocol's operations; the
// candidate registry's are the election protocol's. Every time and verdict of a call (claim
// attempts and retry pauses, heartbeats, renewals, term boundaries, the minimum lease, the release
// and the withdrawal) is core's election machine's (`ElectorMachine`, as the Rust elector drives
// it); this sends what it asks for, wakes it at its one timeout and runs the action.

const os = require('node:os');
const wasm = require('../pkg/leaselock_wasm.js');
const { drive, clock } = require('./drive');
const { LeaseHeldError, LeaseLostError, LeaseLockError, invalid, toRust } = require('./errors');
const { call, json, text } = require('./args');
const { LeaseTable } = require('./table');

/** A unique owner per process: host, pid and a random tail (two electors in one process differ). */
function defaultOwner() {
  return `${os.hostname()}-${process.pid}-${Math.random().toString(36).slice(2, 8)}`;
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
    const machine = this.#rules.leaderMachine(key, seed(), clock.mono());
    return this.#run(machine, { claim: (id) => this.#claim(id, signal) }, action, signal);
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
    const machine = this.#rules.slotMachine(key, slots, seed(), clock.mono());
    return this.#run(machine, { claim }, action, signal);
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
    const run = (op, abort) => drive(op, table.client, abort, undefined, table.clock);
    const requests = {
      claim: (id) => this.#claim(id, signal),
      register: (abort) => run(table.rules.registerCandidate(election, entry, ttl), abort),
      candidates: (abort) => run(table.rules.listCandidates(election), abort),
      withdraw: () => run(table.rules.withdrawCandidate(election, rules.owner)),
      election,
    };
    const machine = call(() => rules.electedMachine(key, strategyJson, seed(), clock.mono()));
    return this.#run(machine, requests, action, signal);
  }

  async #claim(id, signal) {
    return this.#table.acquire(id, { owner: this.#rules.owner, signal });
  }

  /**
   * Drives one call's machine: sends the requests it asks for (each at once, a renewal given up
   * at its deadline), feeds their answers back, wakes it at its timeout, runs the action when it
   * is elected and ends the term's signal when it says so. `outer` (the caller's signal) stops
   * the wait, or ends the action early (the lease is then kept or released as after a return).
   */
  async #run(machine, requests, action, outer) {
    const inbox = [];
    let wake;
    const post = (event) => {
      inbox.push(event);
      wake?.();
    };
    // The error a failed call throws: of a claim, a listing before the term or the first
    // registration (the only requests whose failure ends a call).
    let fatal;
    const send = ({ id, request, until_mono_ms: until }) => {
      const kind = request.request;
      const first = kind.startsWith('claim') || (kind === 'register' ? id === 1 : kind === 'candidates' && !term);
      const done = () => (now) => machine.answered(id, now);
      let gaveUp = () => false;
      let sent;
      switch (kind) {
        case 'claim':
        case 'claim_slot':
          sent = requests.claim(request.key).then((lease) => (now) => {
            held = lease;
            machine.answeredLease(id, JSON.stringify(lease), now);
          });
          break;
        case 'renew': {
          // Rule 2: the renewal is given up at the deadline, one stuck in the network included;
          // the machine's own timeout at the deadline ends the term.
          const atDeadline = AbortSignal.timeout(Math.max(1, Math.ceil(until - clock.mono())));
          gaveUp = () => atDeadline.aborted;
          sent = held.renew({ signal: atDeadline }).then(() => (now) => machine.answeredLease(id, JSON.stringify(held), now));
          break;
        }
        case 'candidates':
          sent = requests
            .candidates(first ? outer : undefined)
            .then((listed) => (now) => machine.answeredCandidates(id, JSON.stringify(listed), now));
          break;
        case 'register':
          sent = requests.register(first ? outer : undefined).then(done);
          break;
        case 'release':
          sent = held.release().then(done);
          break;
        case 'withdraw':
          sent = requests.withdraw().then(done);
          break;
        default:
          throw new LeaseLockError(`unknown election request ${kind}`, 'Store');
      }
      sent.then(post, (e) => {
        if (gaveUp()) {
          return;
        }
        if (first) {
          fatal = e;
        } else if (kind !== 'renew' && !(kind === 'release' && e instanceof LeaseLostError)) {
          // A failed renewal is retried (or ends the term) as the machine says, silently.
          const warning = {
            release: `release of ${held?.id} failed (${e.message}); the lease runs out`,
            register: `candidate refresh of ${requests.election} failed (${e.message})`,
            candidates: `candidate list of ${requests.election} failed (${e.message}); staying on`,
            withdraw: `candidate withdrawal from ${requests.election} failed (${e.message})`,
          };
          process.emitWarning(warning[kind]);
        }
        const rust = e instanceof LeaseHeldError ? JSON.stringify({ kind: 'Held', owner: e.owner }) : toRust(e);
        post((now) => machine.failed(id, rust, now));
      });
    };

    let held;
    let term;
    let work;
    let value;
    let failure;
    const aborted = () => post((now) => machine.abort(now));
    if (outer?.aborted) {
      aborted();
    }
    outer?.addEventListener('abort', aborted, { once: true });
    try {
      for (;;) {
        for (let o = machine.pollOutput(); o !== undefined; o = machine.pollOutput()) {
          const out = JSON.parse(o);
          switch (out.output) {
            case 'send':
              send(out);
              break;
            case 'elected':
              term = new Term(held);
              work = (async () => {
                try {
                  value = await action(term, term.signal);
                } catch (e) {
                  failure = e;
                }
                post((now) => machine.finished(now));
              })();
              break;
            case 'renewed':
              // The held lease was renewed in place: the term's deadline is its.
              break;
            case 'term_over':
              term._end(out.reason, outer?.reason);
              break;
            case 'done':
              return await this.#ended(out.ended, { term, work, value: () => value, failure: () => failure, fatal, outer });
            default:
              throw new LeaseLockError(`unknown election output ${out.output}`, 'Store');
          }
        }
        if (inbox.length === 0) {
          const at = machine.pollTimeout();
          let timer;
          await new Promise((resolve) => {
            wake = resolve;
            if (at !== undefined) {
              timer = setTimeout(resolve, Math.max(0, at - clock.mono()));
            }
          });
          wake = undefined;
          clearTimeout(timer);
        }
        const now = clock.mono();
        for (const event of inbox.splice(0)) {
          event(now);
        }
        machine.handleTimeout(now);
      }
    } finally {
      outer?.removeEventListener('abort', aborted);
      machine.free();
    }
  }

  /** What a call's outcome returns (or throws). */
  async #ended(ended, { term, work, value, failure, fatal, outer }) {
    switch (ended.outcome) {
      case 'led':
        await work;
        term._end('Released');
        if (failure() !== undefined) {
          throw failure();
        }
        return { led: true, skipped: false, fence: ended.fence, value: value(), end: ended.end };
      case 'skipped':
        return skipped(ended.holder);
      case 'aborted':
        throw outer?.reason ?? new LeaseLockError('election aborted', 'Aborted');
      default:
        throw fatal ?? new LeaseLockError(`election failed: ${JSON.stringify(ended.error)}`, 'Store');
    }
  }
}

/** A seed for a call's random source (its retry jitter). */
function seed() {
  return Math.floor(Math.random() * 2 ** 52);
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

  constructor(lease) {
    this.#lease = lease;
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

  _end(reason, cause) {
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
