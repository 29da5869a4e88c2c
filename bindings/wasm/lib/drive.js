'use strict';
// Runs one protocol operation to its end: sends what it asks for, sleeps where it says, and
// feeds every answer back with the clocks and a random draw. No decision is taken here.

const { performance } = require('node:perf_hooks');
const wasm = require('../pkg/leaselock_wasm.js');
const { send, measuredAttempt } = require('./io');
const { fromRust } = require('./errors');

/** Wall clock (expiries are written in it) and monotonic clock (deadlines are measured on it). */
const clock = {
  now: () => Date.now(),
  mono: () => performance.now(),
};

/** At most one request in this long (ms) is measured (core's `SAMPLE_SPACING_MS`). */
const SAMPLE_SPACING_MS = 50;

/**
 * A table's clocks: the wall clock on the store's time, measured from the `date` header of
 * every answer (wasm `StoreClock`, applied once known within `trustMs`), and the monotonic
 * clock as it is.
 */
class TableClock {
  #store;
  /** The next request sent from then on (`performance.now()`) is measured. */
  #nextSample = 0;

  constructor(trustMs) {
    this.#store = new wasm.StoreClock(trustMs);
    /** The single-attempt middleware of the table's requests, measuring their answers. */
    this.attempt = measuredAttempt(
      (sentWall, sentMono, headers) => this.observe(sentWall, sentMono, headers),
      (sentMono) => this.wantsSample(sentMono),
    );
  }

  /**
   * Whether a request sent at `mono` is measured: at most one in 50 ms (as the Rust driver:
   * answers sent at one moment bound the store's clock alike; each costs a little CPU).
   */
  wantsSample(mono) {
    if (mono < this.#nextSample) {
      return false;
    }
    this.#nextSample = mono + SAMPLE_SPACING_MS;
    return true;
  }

  now() {
    return this.#store.wallMs(Date.now(), performance.now());
  }

  mono() {
    return performance.now();
  }

  /** One answer's headers, with the local clocks when its request went out. */
  observe(sentWall, sentMono, headers) {
    const date = headers?.date;
    if (typeof date === 'string') {
      this.#store.observe(sentWall, sentMono, Date.now(), performance.now(), date, headers.age);
    }
  }

  /** `{ offsetMs, uncertaintyMs, samples }` (the store's clock minus this host's), or undefined. */
  estimate() {
    return this.#store.estimate(Date.now(), performance.now());
  }

  /** When (`performance.now()`) to send a request so that its answer narrows the estimate most. */
  probeAt(roundTripMs) {
    return this.#store.probeAt(Math.max(performance.now(), this.#nextSample), roundTripMs);
  }
}

/** Resolves after `ms`, or rejects with the signal's reason. */
function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

/**
 * Drives `op` (a wasm `Op`) with `client` until it is done; resolves its value or rejects with
 * its error (store errors carry the last SDK error as `cause`). `appendItems`: the caller's
 * actions of a fenced write, appended to its transaction on every attempt. `times`: the table's
 * clock (`TableClock`), which each answer measures.
 */
async function drive(op, client, signal, appendItems, times = clock) {
  let lastError;
  try {
    let step = JSON.parse(op.resume(times.now(), times.mono(), Math.random()));
    for (;;) {
      if (step.send !== undefined) {
        const request = step.request[step.send];
        const sent = await send(client, step.send, request, step.timeoutMs, signal, appendItems, times.attempt);
        if (sent.failure === undefined) {
          step = JSON.parse(op.answer(times.now(), times.mono(), Math.random(), sent.output));
        } else {
          lastError = sent.error;
          step = JSON.parse(op.failed(times.now(), times.mono(), Math.random(), sent.failure));
        }
      } else if (step.sleep !== undefined) {
        await sleep(step.sleep, signal);
        step = JSON.parse(op.resume(times.now(), times.mono(), Math.random()));
      } else if (step.fail !== undefined) {
        throw fromRust(step.fail, lastError);
      } else {
        return step.done;
      }
    }
  } finally {
    op.free();
  }
}

/** Runs the functions given to `run` one at a time, in order; a failure does not stop the next. */
class Serial {
  #queue = Promise.resolve();

  run(fn) {
    const run = this.#queue.then(fn);
    this.#queue = run.catch(() => {});
    return run;
  }
}

module.exports = { drive, sleep, clock, Serial, TableClock };
