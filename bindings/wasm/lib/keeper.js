'use strict';
// Keeps one held lease: renews it when the protocol's schedule says, and aborts its signal at
// the local deadline, on a lost lease, on STOP (seen on a renewal) or when told to. Every time
// and every verdict comes from the wasm decisions; this only waits and sends.

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
  #rules;
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
    this.#rules = lease.table.rules;
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

  async #renewUntilLost() {
    const lease = this.#lease;
    let next = this.#rules.nextRenewAt(JSON.stringify(lease));
    let attempt = 0;
    for (;;) {
      if (this.#stopping.signal.aborted) {
        return;
      }
      if (clock.mono() >= lease.deadline) {
        this.cancel('Deadline');
        return;
      }
      await this.#sleepUntil(Math.min(next, lease.deadline));
      if (this.#stopping.signal.aborted) {
        return;
      }
      const now = clock.mono();
      if (now >= lease.deadline) {
        this.cancel('Deadline');
        return;
      }
      if (now < next) {
        continue;
      }
      // Rule 2: nothing may run past the deadline, a renewal stuck in the network included.
      const atDeadline = AbortSignal.timeout(Math.max(1, Math.ceil(lease.deadline - now)));
      let step;
      try {
        await lease.renew({ signal: atDeadline });
        attempt = 0;
        step = JSON.parse(this.#rules.afterRenewal(JSON.stringify(lease)));
      } catch (e) {
        if (atDeadline.aborted) {
          this.cancel('Deadline');
          return;
        }
        step = JSON.parse(
          this.#rules.afterRenewalError(toRust(e), attempt, clock.mono(), lease.deadline, Math.random()),
        );
        attempt += 1;
      }
      switch (step.step) {
        case 'RenewAt':
        case 'RetryAt':
          next = step.at;
          break;
        case 'StoppedRenewAt':
          this.cancel('Stopped');
          next = step.at;
          break;
        case 'Lost':
          this.cancel('Lost');
          return;
        case 'Deadline':
          // Wait out the deadline itself: the loop cancels with `Deadline` there.
          next = lease.deadline;
          break;
        default:
          throw new Error(`unknown renewal step ${step.step}`);
      }
    }
  }
}

/**
 * Session mode's keeper of one held connection: nothing is renewed per connection (the
 * session's renewals move the lease's deadline); aborts the signal at the deadline (rule 2), on
 * STOP or when told to. The same face as Keeper.
 */
class SessionHold {
  #lease;
  #controller = new AbortController();
  #timer;
  #reason;

  constructor(lease) {
    this.#lease = lease;
    this.#arm();
  }

  get signal() {
    return this.#controller.signal;
  }

  get reason() {
    return this.#reason;
  }

  cancel(reason) {
    if (this.#controller.signal.aborted) {
      return false;
    }
    this.#reason = reason;
    this.#controller.abort(abortReason(reason, this.#lease.id));
    return true;
  }

  /** Wakes at the lease's deadline; a deadline moved meanwhile is waited for in turn. */
  #arm() {
    const left = this.#lease.deadline - clock.mono();
    if (left <= 0) {
      this.cancel('Deadline');
      return;
    }
    this.#timer = setTimeout(() => this.#arm(), Math.ceil(left));
  }

  async stop() {
    clearTimeout(this.#timer);
  }
}

module.exports = { Keeper, SessionHold, abortReason };
