'use strict';
// The Node worker: a driver of core's worker engine (`WorkerEngine`, through wasm), as the tokio
// worker is in Rust. Every decision is the engine's: claims (claims in flight, claims whose answer
// was lost, the claim limit), renewals and deadlines, the session and its cover, balance and
// hand-over rounds, orphan polls, hints, desired-state checks, shutdown, the counters. This file
// runs the commands it emits (store operations with the table's DynamoDBClient, SQS hints,
// handlers with an AbortSignal each, metrics lines), feeds every answer back, and sleeps until
// the engine's next timeout or the next answer.

const os = require('node:os');
const wasm = require('../pkg/leaselock_wasm.js');
const { clock, drive } = require('./drive');
const { LeaseLostError, invalid, toRust } = require('./errors');
const { abortReason } = require('./keeper');
const { Lease } = require('./table');
const { call, json } = require('./args');

const MAX_TIMER_MS = 2 ** 31 - 1;

/** Store operations that only read: dropped, not waited for, once the run is over. */
const READS = new Set(['get', 'orphansPage', 'sessions', 'ownedBy', 'desiredStates']);

/** What a handler is given for one held lease. */
class Connection {
  #lease;
  #signal;
  #onLost;

  constructor(lease, signal, onLost) {
    this.#lease = lease;
    this.#signal = signal;
    this.#onLost = onLost;
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

  /** Milliseconds left before `deadline`, 0 once past. */
  timeLeft() {
    return this.#lease.timeLeft();
  }

  get lease() {
    return this.#lease;
  }

  /**
   * The store's time now (epoch ms), as measured from DynamoDB's answers: stamp what the handler
   * writes with it, so stamps agree across the fleet whatever each host's clock says.
   */
  nowMs() {
    return this.#lease.table.clock.now();
  }

  /** Aborts at the deadline, on STOP, on a lost lease, on a hand-over and on shutdown; `reason` says which. */
  get signal() {
    return this.#signal;
  }

  /** Records the last processed sequence number under the lease; LeaseLostError aborts the signal. */
  checkpoint(seq, options) {
    return this.#lease.checkpoint(seq, options).catch(this.#onLost);
  }

  /** A fenced write (see `Lease.write`): `writes` apply only while the lease is ours. */
  write(writes, options) {
    return this.#lease.write(writes, options).catch(this.#onLost);
  }
}

/** One held lease as the driver keeps it: the copy its handler shares, and its signal. */
class Slot {
  lease;
  controller = new AbortController();
  /** The CancelReason the signal aborted with. */
  reason;
  ended = false;

  constructor(lease) {
    this.lease = lease;
  }

  /** Aborts the signal with `reason` (the first reason wins). */
  cancel(reason) {
    if (!this.controller.signal.aborted) {
      this.reason = reason;
      this.controller.abort(abortReason(reason, this.lease.id));
    }
  }
}

class Worker {
  #table;
  #sqs;
  #queueUrl;
  #handler;
  #logger;
  #metrics;
  #engine;
  #settings;
  /** id -> Slot of every handler started and not forgotten. */
  #slots = new Map();
  /** Answers and events waiting for the engine: each a function of the time (wall, mono). */
  #events = [];
  /** Writes, handlers' ends and hint receives (waited for at the end) and their promises. */
  #tasks = new Set();
  /** Aborts the reads still in flight once the run is over. */
  #reads = new AbortController();
  #wake;
  #shutdownAsked = false;
  /** The store's clock as last told to the engine. */
  #clockTold;
  #shutdownSent = false;
  #finished = false;

  /**
   * @param {object} options `table` (a LeaseTable), `handler(conn, signal)` (async), and
   *   optionally `sqs` + `queueUrl` (START hints), `maxConnections`, `workerId`,
   *   `orphanIntervalMs`, `desiredStateIntervalMs`, `handlerGraceMs`, `hintWaitMs`, `indexLagMs`,
   *   `metricsIntervalMs`, `metricsNamespace`, `metrics` (where the EMF lines go: a function of
   *   the line, default stdout), `logger`, `balance` (session mode; default true),
   *   `clockToleranceMs` (claims wait until the store's clock, measured from the table's
   *   answers, is known within it; default half the clock skew) and `waitForStoreClock`
   *   (default true; false claims on this host's clock until the store's is known).
   */
  constructor(options) {
    const { table, sqs, handler, logger, metrics, ...rest } = options ?? {};
    if (typeof table?.acquireStarted !== 'function') {
      throw invalid('table', 'a LeaseTable is required');
    }
    if (typeof handler !== 'function') {
      throw invalid('handler', 'must be an async function (conn, signal)');
    }
    if (sqs !== undefined && typeof sqs?.send !== 'function') {
      throw invalid('sqs', 'must be an SQSClient from @aws-sdk/client-sqs');
    }
    if (metrics !== undefined && typeof metrics !== 'function') {
      throw invalid('metrics', 'must be a function (line) => void');
    }
    const workerId = rest.workerId ?? defaultWorkerId();
    const settings = json('options', { ...rest, workerId, hints: sqs !== undefined });
    const seed = Math.floor(Math.random() * 2 ** 53);
    this.#engine = call(() => wasm.WorkerEngine.forWorker(table.rules, settings, seed, table.clock.now(), clock.mono()));
    this.#settings = this.#engine.settings;
    this.#table = table;
    this.#sqs = sqs;
    this.#queueUrl = rest.queueUrl;
    this.#handler = handler;
    this.#logger = logger ?? stderrLogger();
    this.#metrics = metrics ?? ((line) => process.stdout.write(`${line}\n`));
  }

  get workerId() {
    return this.#settings.workerId;
  }

  /** Counters since start and the ids held now (sorted). */
  snapshot() {
    return this.#engine.view();
  }

  /** Starts the graceful shutdown that `run()` completes. */
  shutdown() {
    this.#shutdownAsked = true;
    this.#wake?.();
  }

  /**
   * Runs until SIGTERM, SIGINT, `signal` or `shutdown()`; then stops claiming, aborts every
   * handler, waits for them (at most `handlerGraceMs` each), releases every lease in parallel
   * (session mode: ends the session with one write), hints the released work, and resolves with
   * the final snapshot. The table is checked first (`LeaseTable.checkTable`): a global table in
   * multi-Region eventual consistency (or a missing table) rejects before anything is claimed.
   */
  async run({ signal } = {}) {
    const stop = () => this.shutdown();
    process.once('SIGTERM', stop);
    process.once('SIGINT', stop);
    signal?.addEventListener('abort', stop, { once: true });
    const engine = this.#engine;
    try {
      await this.#table.checkTable({ signal });
      this.#measureStoreClock();
      this.#logger.info?.('worker started', { workerId: this.workerId, maxConnections: this.#settings.maxConnections });
      for (;;) {
        this.#runCommands();
        if (this.#finished) {
          break;
        }
        await this.#sleep();
        const times = this.#table.clock;
        if (this.#shutdownAsked && !this.#shutdownSent) {
          this.#shutdownSent = true;
          engine.shutdown(times.now(), times.mono());
        }
        this.#tellStoreClock();
        const events = this.#events.splice(0);
        for (const event of events) {
          event(times.now(), times.mono());
        }
        if (events.length === 0) {
          engine.handleTimeout(times.now(), times.mono());
        }
        this.#flushLogs();
      }
      // Writes still in flight and hints being sent or settled finish; reads are dropped.
      this.#reads.abort();
      while (this.#tasks.size > 0) {
        await Promise.allSettled([...this.#tasks]);
      }
      this.#flushLogs();
      return this.snapshot();
    } finally {
      process.removeListener('SIGTERM', stop);
      process.removeListener('SIGINT', stop);
      signal?.removeEventListener('abort', stop);
    }
  }

  /**
   * Claims wait for the store's clock: a few requests timed to measure it at once, beside the
   * engine's own (whose answers measure it too); given up when the run ends. Its end wakes the
   * loop, which tells the engine.
   */
  #measureStoreClock() {
    const { waitForStoreClock, clockToleranceMs } = this.#settings;
    if (!waitForStoreClock) {
      return;
    }
    const withinMs = clockToleranceMs ?? this.#table.clockSkewMs / 2;
    const measured = this.#table.measureClock({ withinMs, signal: this.#reads.signal });
    this.#track(
      measured.then(
        () => () => {},
        () => undefined,
      ),
      false,
    );
  }

  /** The store's clock as measured now, when it changed since the engine was last told. */
  #tellStoreClock() {
    const e = this.#table.clock.estimate();
    const told = this.#clockTold;
    if (e === undefined || (e.offsetMs === told?.offsetMs && e.uncertaintyMs === told?.uncertaintyMs)) {
      return;
    }
    this.#clockTold = e;
    this.#engine.storeClock(e.offsetMs, e.uncertaintyMs, this.#table.clock.now(), clock.mono());
  }

  /** Resolves at the engine's next timeout, or as soon as an answer or a shutdown comes in. */
  #sleep() {
    if (this.#events.length > 0 || (this.#shutdownAsked && !this.#shutdownSent)) {
      return undefined;
    }
    const at = this.#engine.pollTimeout();
    let timer;
    return new Promise((resolve) => {
      this.#wake = resolve;
      if (at !== undefined) {
        // setTimeout fires at once past 2^31 - 1 ms: a later wake is a wake to look again.
        timer = setTimeout(resolve, Math.min(MAX_TIMER_MS, Math.max(0, Math.ceil(at - clock.mono()))));
      }
    }).finally(() => {
      clearTimeout(timer);
      this.#wake = undefined;
    });
  }

  /** Queues `event` (a function of the time) for the engine and wakes the loop. */
  #feed(event) {
    this.#events.push(event);
    this.#wake?.();
  }

  /**
   * Feeds the event `promise` resolves to (if any) to the engine; `waited`: the end of the run
   * waits for it (writes, hints; not reads, nor handlers, which may never settle).
   */
  #track(promise, waited = true) {
    const task = promise.then((event) => {
      if (typeof event === 'function' && !this.#finished) {
        this.#feed(event);
      }
    });
    if (waited) {
      this.#tasks.add(task);
      task.finally(() => this.#tasks.delete(task));
    }
  }

  #flushLogs() {
    for (const { level, message, fields } of this.#engine.takeLogs()) {
      const log = level === 'info' ? this.#logger.info : (this.#logger[level] ?? this.#logger.warn);
      log?.call(this.#logger, message, fields);
    }
  }

  #runCommands() {
    for (let c = this.#engine.nextCommand(); c !== undefined; c = this.#engine.nextCommand()) {
      this.#run(c);
    }
  }

  #run(c) {
    switch (c.command) {
      case 'run':
        this.#operation(c);
        break;
      case 'startHandler':
        this.#startHandler(c.lease);
        break;
      case 'cancelHandler':
        this.#slots.get(c.id)?.cancel(c.reason);
        break;
      case 'abortHandler':
        // A promise cannot be stopped: the handler is left behind and its lease released.
        this.#logger.warn('handler ignored its signal; releasing without it', { connectionId: c.id });
        this.#handlerEnded(this.#slots.get(c.id), 'aborted');
        break;
      case 'setDeadline':
        this.#slots.get(c.id)?.lease._cover(c.deadline);
        break;
      case 'forget': {
        // Anything the handler left running with the connection stops now.
        this.#slots.get(c.id)?.cancel('Released');
        this.#slots.delete(c.id);
        break;
      }
      case 'receiveHints':
        this.#receiveHints(c.max, c.waitMs);
        break;
      case 'settleHints':
        this.#settleHints(c);
        break;
      case 'sendHint':
        this.#sendHint(c.id, c.body);
        break;
      case 'emitMetrics':
        this.#metrics(this.#engine.metricsLine(this.#table.clock.now()));
        break;
      case 'finished':
        this.#finished = true;
        break;
      default:
        throw new Error(`unknown engine command ${c.command}`);
    }
  }

  /** Runs the store operation of a `run` command and feeds its answer back. */
  #operation({ op, kind, id, until }) {
    const engine = this.#engine;
    // Rule 2: a renewal is given up at the deadline, one stuck in the network included.
    const deadline = until === null ? undefined : AbortSignal.timeout(Math.max(1, Math.ceil(until - clock.mono())));
    if (kind === 'renew' || kind === 'release') {
      const lease = this.#slots.get(id)?.lease;
      if (lease === undefined) {
        const lost = JSON.stringify({ kind: 'Lost', id, message: `lease on ${id} lost` });
        this.#feed((now, mono) => engine.failedWith(op, lost, now, mono));
        return;
      }
      const done = kind === 'renew' ? lease.renew({ signal: deadline }) : lease.release();
      this.#track(
        done.then(
          () =>
            kind === 'renew'
              ? (now, mono) => engine.renewed(op, lease.toJSON(), now, mono)
              : (now, mono) => engine.released(op, now, mono),
          (e) =>
            deadline?.aborted
              ? (now, mono) => engine.pastDeadline(op, id, now, mono)
              : (now, mono) => engine.failedWith(op, toRust(e), now, mono),
        ),
      );
      return;
    }
    engine.operation(op);
    const read = READS.has(kind);
    const stepper = {
      resume: (now, mono, random) => engine.resume(op, now, mono, random),
      answer: (now, mono, random, output) => engine.answered(op, now, mono, random, output),
      failed: (now, mono, random, failure) => engine.failed(op, now, mono, random, failure),
      free() {},
    };
    const signal = deadline ?? (read ? this.#reads.signal : undefined);
    this.#track(
      drive(stepper, this.#table.client, signal, undefined, this.#table.clock).then(
        () => (now, mono) => engine.finish(op, now, mono),
        () =>
          deadline?.aborted ? (now, mono) => engine.pastDeadline(op, `session/${this.workerId}`, now, mono) : undefined,
      ),
      !read,
    );
  }

  #startHandler(data) {
    const lease = new Lease(this.#table, data);
    const slot = new Slot(lease);
    const id = lease.id;
    this.#slots.set(id, slot);
    const { signal } = slot.controller;
    const onLost = (e) => {
      if (e instanceof LeaseLostError) {
        slot.cancel('Lost');
      }
      throw e;
    };
    const conn = new Connection(lease, signal, onLost);
    const ended = Promise.resolve()
      .then(() => this.#handler(conn, signal))
      .then(
        () => 'returned',
        (error) => {
          if (signal.aborted && error === signal.reason) {
            return 'returned';
          }
          this.#logger.warn('handler failed', { connectionId: id, error: String(error?.message ?? error) });
          return 'failed';
        },
      );
    this.#track(
      ended.then((end) => this.#handlerEnded(slot, end, false)),
      false,
    );
  }

  /** The handler of `slot` ended (`returned`, `failed`, or `aborted` by the driver). */
  #handlerEnded(slot, end, feed = true) {
    if (slot === undefined || slot.ended) {
      return undefined;
    }
    slot.ended = true;
    const event = (now, mono) => this.#engine.handlerEnded(slot.lease.id, end, slot.reason, now, mono);
    if (feed) {
      this.#feed(event);
    }
    return event;
  }

  /** One long poll of the hint queue. Not abandoned at shutdown: the engine gives back what it brings. */
  #receiveHints(max, waitMs) {
    const { ReceiveMessageCommand } = require('@aws-sdk/client-sqs');
    const engine = this.#engine;
    const receive = new ReceiveMessageCommand({
      QueueUrl: this.#queueUrl,
      MaxNumberOfMessages: Math.min(10, Math.max(1, max)),
      WaitTimeSeconds: Math.floor(waitMs / 1000),
    });
    // One the server has not answered a margin after its wait counts as failed.
    const answered = AbortSignal.timeout(waitMs + this.#settings.pollAnswerMarginMs);
    this.#track(
      this.#sqs.send(receive, { abortSignal: answered }).then(
        (out) => {
          const messages = (out.Messages ?? [])
            .filter((m) => m.ReceiptHandle !== undefined)
            .map((m) => ({ receipt: m.ReceiptHandle, body: m.Body ?? null }));
          return (now, mono) => engine.hints(messages, now, mono);
        },
        (e) => (now, mono) => engine.hintsFailed(String(e?.message ?? e), now, mono),
      ),
    );
  }

  /** Deletes the handled hints; gives back at once those with no room here, later those deferred. */
  #settleHints({ delete: remove, giveBack, defer, deferMs }) {
    const { DeleteMessageBatchCommand, ChangeMessageVisibilityBatchCommand } = require('@aws-sdk/client-sqs');
    const queue = this.#queueUrl;
    const later = Math.min(Math.ceil(deferMs / 1000), 43_200);
    const visible = [...giveBack.map((r) => [r, 0]), ...defer.map((r) => [r, later])];
    const settle = async () => {
      if (remove.length > 0) {
        const entries = remove.map((r, i) => ({ Id: String(i), ReceiptHandle: r }));
        const out = await this.#sqs.send(new DeleteMessageBatchCommand({ QueueUrl: queue, Entries: entries }));
        if ((out?.Failed ?? []).length > 0) {
          this.#logger.warn('some hints not deleted', { failed: out.Failed.length });
        }
      }
      if (visible.length > 0) {
        const entries = visible.map(([r, s], i) => ({ Id: String(i), ReceiptHandle: r, VisibilityTimeout: s }));
        await this.#sqs.send(new ChangeMessageVisibilityBatchCommand({ QueueUrl: queue, Entries: entries }));
      }
    };
    this.#track(settle().catch((e) => this.#logger.warn('hint settle failed', { error: String(e?.message ?? e) })));
  }

  /** Hints released work to the fleet, so another worker claims it at once. Best effort. */
  #sendHint(id, body) {
    const { SendMessageCommand } = require('@aws-sdk/client-sqs');
    const message = new SendMessageCommand({ QueueUrl: this.#queueUrl, MessageBody: body });
    const sent = this.#sqs.send(message, { abortSignal: AbortSignal.timeout(this.#settings.handOverTimeoutMs) });
    this.#track(sent.then(
      () => undefined,
      (e) => this.#logger.warn('hand-over hint failed', { connectionId: id, error: String(e?.message ?? e) }),
    ));
  }
}

/** host-pid-random: unique per process, and readable in the table (as the Rust worker's). */
function defaultWorkerId() {
  const suffix = Math.floor(Math.random() * 0x1000000)
    .toString(16)
    .padStart(6, '0');
  return `${os.hostname() || 'worker'}-${process.pid}-${suffix}`;
}

const LEVELS = ['off', 'error', 'warn', 'info', 'debug', 'trace'];

/**
 * How verbose the default logger is, from `LEASELOCK_LOG` read as the Rust and Python workers
 * read it: comma-separated directives, each a level (`info`) or `target=level`
 * (`leaselock::engine=info`); the most verbose one that applies to leaselock wins. Unset or
 * empty: `warn`. A directive that does not parse is reported once and skipped.
 */
function logLevel(spec = process.env.LEASELOCK_LOG) {
  if (spec == null || spec.trim() === '') {
    return LEVELS.indexOf('warn');
  }
  let level = 0;
  for (const directive of spec.split(',').map((d) => d.trim()).filter((d) => d !== '')) {
    const [target, name] = directive.includes('=') ? directive.split('=', 2) : ['', directive];
    const at = LEVELS.indexOf(name.trim().toLowerCase());
    if (at < 0) {
      process.stderr.write(`${JSON.stringify({ level: 'WARN', message: 'LEASELOCK_LOG directive ignored', directive })}\n`);
    } else if (target === '' || target === 'leaselock' || target.startsWith('leaselock::')) {
      level = Math.max(level, at);
    }
  }
  return level;
}

/** The default logger: JSON lines on stderr, each with its UTC time, at `LEASELOCK_LOG`'s level. */
function stderrLogger(level = logLevel()) {
  const line = (name) => (message, fields) => {
    const record = { time: new Date().toISOString(), level: name.toUpperCase(), message, ...fields };
    process.stderr.write(`${JSON.stringify(record)}\n`);
  };
  const logger = {};
  for (const name of ['error', 'warn', 'info']) {
    if (LEVELS.indexOf(name) <= level) {
      logger[name] = line(name);
    }
  }
  // The driver's own warnings go to `warn`: kept a no-op when the level is below it.
  logger.warn ??= () => {};
  return logger;
}

module.exports = { Worker, Connection, defaultWorkerId, logLevel };
