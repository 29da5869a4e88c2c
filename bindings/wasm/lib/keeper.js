'use strict';
// Keeps one lease held in `LeaseTable.using`: drives core's holder machine (`HolderMachine`:
// the renewal schedule, retry policy and rule 2 deadline every held lease of every language
// runs on), sending the renewals it asks for and aborting the signal with the reason it gives
// (the local deadline, a lost lease, STOP seen on a renewal, or when told to). This only waits
// and sends.

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
  #holder;
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
    const seed = Math.floor(Math.random() * 2 ** 52);
    this.#holder = new wasm.HolderMachine(lease.table.rules, JSON.stringify(lease.toJSON()), 'renew', seed, clock.mono());
    if (outer) {
      // The lease stays renewed while the routine winds down (the machine's Shutdown).
      const forward = () => {
        this.#abortWith(outer.reason, 'Shutdown');
        this.#tell((h) => h.cancel('Shutdown', clock.mono()));
      };
      if (outer.aborted) {
        forward();
      } else {
        outer.addEventListener('abort', forward, { once: true });
        this.#stopping.signal.addEventListener('abort', () => outer.removeEventListener('abort', forward));
      }
    }
    this.#done = this.#keep();
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
  /** The renewal the machine asked for and not sent yet: `{ id, until }`. */
  #renew;
  #over = false;

  /** Tells the machine the holder cancels for `reason`; true if the signal aborted for it. */
  cancel(reason) {
    const before = this.#reason;
    this.#tell((h) => h.cancel(reason, clock.mono()));
    return before === undefined && this.#reason === reason;
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

  /** Feeds the machine (`input(holder)`) and does what it says. */
  #tell(input) {
    if (this.#over) {
      return;
    }
    input(this.#holder);
    for (let o = this.#holder.pollOutput(); o !== undefined; o = this.#holder.pollOutput()) {
      const out = JSON.parse(o);
      if (out.output === 'renew') {
        this.#renew = { id: out.id, until: out.until_mono_ms };
      } else if (out.output === 'cancel') {
        this.#abortWith(abortReason(out.reason, this.#lease.id), out.reason);
      } else if (out.output === 'over') {
        this.#over = true;
        this.#renew = undefined;
      }
    }
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

  /** Sends the renewals the machine asks for and wakes it on time, until it is over or `stop()`. */
  async #keep() {
    const lease = this.#lease;
    try {
      for (;;) {
        // A renewal by hand (`lease.renew()`) moved the deadline; then the time.
        this.#tell((h) => h.cover(lease.deadline, clock.mono()));
        if (this.#over || this.#stopping.signal.aborted) {
          return;
        }
        const renew = this.#renew;
        if (renew === undefined) {
          await this.#sleepUntil(this.#holder.pollTimeout());
          continue;
        }
        this.#renew = undefined;
        // Rule 2: nothing may run past the deadline, a renewal stuck in the network included.
        const atDeadline = AbortSignal.timeout(Math.max(1, Math.ceil(renew.until - clock.mono())));
        try {
          await lease.renew({ signal: atDeadline });
          this.#tell((h) => h.renewed(renew.id, JSON.stringify(lease.toJSON()), clock.mono()));
        } catch (e) {
          // Given up at the deadline, it reports nothing: the machine's own time decides.
          if (!atDeadline.aborted) {
            this.#tell((h) => h.failed(renew.id, toRust(e), clock.mono()));
          }
        }
      }
    } finally {
      this.#over = true;
      this.#holder.free();
    }
  }
}

module.exports = { Keeper, abortReason };
