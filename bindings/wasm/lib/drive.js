'use strict';
// Runs one protocol operation to its end: sends what it asks for, sleeps where it says, and
// feeds every answer back with the clocks and a random draw. No decision is taken here.

const { performance } = require('node:perf_hooks');
const { send } = require('./io');
const { fromRust } = require('./errors');

/** Wall clock (expiries are written in it) and monotonic clock (deadlines are measured on it). */
const clock = {
  now: () => Date.now(),
  mono: () => performance.now(),
};

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
 * actions of a fenced write, appended to its transaction on every attempt.
 */
async function drive(op, client, signal, appendItems) {
  let lastError;
  try {
    let step = JSON.parse(op.resume(clock.now(), clock.mono(), Math.random()));
    for (;;) {
      if (step.send !== undefined) {
        const sent = await send(client, step.send, step.request[step.send], step.timeoutMs, signal, appendItems);
        if (sent.failure === undefined) {
          step = JSON.parse(op.answer(clock.now(), clock.mono(), Math.random(), sent.output));
        } else {
          lastError = sent.error;
          step = JSON.parse(op.failed(clock.now(), clock.mono(), Math.random(), sent.failure));
        }
      } else if (step.sleep !== undefined) {
        await sleep(step.sleep, signal);
        step = JSON.parse(op.resume(clock.now(), clock.mono(), Math.random()));
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

module.exports = { drive, sleep, clock, Serial };
