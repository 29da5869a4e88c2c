'use strict';
// Keeps one held lease: renews it when core's keeper (`LeaseKeeper`, the one the worker engine
// keeps every held lease with) says, and aborts its signal at the local deadline, on a lost
// lease, on STOP (seen on a renewal) or when told to. This only waits and sends.

const wasm = require('../pkg/leaselock_wasm.js');
const { clock } = require('./drive');
const { LeaseLockError, LeaseLostError, LeaseStoppedError, ShutdownError, toRust } = require('./errors');

/** The abort reason of a handler's signal: an error whose `reason` names the CancelReason. */
function abortReason(reason, id) {
  switch (reason) {
    case 'Lost':
    case 'Deadline':
      return new LeaseLostError(`lease on ${id} lost (${reason})`, { id, reason });
    case 'Stopped':
      return new LeaseStoppedError(`${id} is stopped`, { id, reason });
    case 'Shutdown':
      return new ShutdownError(`the worker is shutting down; ${id} is being released`);
    default: {
      const e = new LeaseLockError(`lease on ${id} released`, reason);
      e.reason = reason;
      return e;
    }
  }
}

class Keeper {
  #lease;
  #controller = new AbortController();
  #stopping = new AbortController();
  #done;
  #onEnd;

  /**
   * @param lease the held Lease
   * @param outer an AbortSignal whose abort also aborts the lease's signal (with its reason)
   * @param onEnd called once the lease's signal has aborted, with the reason
   */
  constructor(lease, outer, onEnd) {
    this.#lease = lease;
    this.#onEnd = onEnd;
    if (outer) {
      const forward = () => this.#abortWith(outer.reason, 'Shutdown');
      if (outer.aborted) {
        forward();
      } else {
        outer.addEventListener('abort', forward, { once: true });
        this.#stopping.signal.addEventListener('abort', () => outer.removeEventListener('abort', forward));
      }
    }
    this.#done = this.#renewUntilLost();
  }

  /** Aborts (with the reason) at the deadline, when the lease is lost, on STOP and on `cancel`. */
  get signal() {
    return this.#controller.signal;
  }

  /** The CancelReason of the abort, undefined while it has not aborted. */
  get reason() {
    return this.#reason;
  }

  #reason;

  /** Aborts the signal with `reason` unless it has aborted already; true if this call did. */
  cancel(reason) {
    return this.#abortWith(abortReason(reason, this.#lease.id), reason);
  }

  #abortWith(error, reason) {
    if (this.#controller.signal.aborted) {
      return false;
    }
    this.#reason = reason;
    this.#controller.abort(error);
    this.#onEnd?.(reason);
    return true;
  }

  /** Stops renewing (the routine has ended) and waits for a renewal in flight. */
  async stop() {
    this.#stopping.abort();
    await this.#done;
  }

  /** Resolves at monotonic time `at`, or early when the keeper stops. */
  #sleepUntil(at) {
    const ms = Math.max(0, at - clock.mono());
    return new Promise((resolve) => {
      const stopping = this.#stopping.signal;
      if (stopping.aborted) {
        resolve();
        return;
      }
      const wake = () => {
        clearTimeout(timer);
        stopping.removeEventListener('abort', wake);
        resolve();
      };
      const timer = setTimeout(wake, ms);
      stopping.addEventListener('abort', wake, { once: true });
    });
  }

  /** Renews when core's keeper says, until the deadline, a lost lease or `stop()`. */
  async #renewUntilLost() {
    const lease = this.#lease;
    const keeper = new wasm.LeaseKeeper(lease.table.rules, lease.toJSON());
    try {
      for (;;) {
        if (this.#stopping.signal.aborted) {
          return;
        }
        const wake = keeper.poll(clock.mono());
        if (wake === 'deadline') {
          this.cancel('Deadline');
          return;
        }
        if (wake !== 'renew') {
          await this.#sleepUntil(wake);
          continue;
        }
        // Rule 2: nothing may run past the deadline, a renewal stuck in the network included.
        const atDeadline = AbortSignal.timeout(Math.max(1, Math.ceil(keeper.deadline - clock.mono())));
        let reason;
        try {
          await lease.renew({ signal: atDeadline });
          reason = keeper.renewed(lease.toJSON(), clock.mono(), Math.random());
        } catch (e) {
          if (atDeadline.aborted) {
            this.cancel('Deadline');
            return;
          }
          reason = keeper.failed(toRust(e), clock.mono(), Math.random());
        }
        if (reason !== undefined) {
          this.cancel(reason);
        }
        if (reason === 'Lost') {
          return;
        }
      }
    } finally {
      keeper.free();
    }
  }
}

module.exports = { Keeper, abortReason };
