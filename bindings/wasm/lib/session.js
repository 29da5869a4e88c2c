'use strict';
// Session mode: one session item per worker, renewed for every connection held under it. A
// Session is the handle of one epoch; each operation is core's protocol (CreateSession,
// RenewSession, EndSession, ClaimInSession) driven with the table's DynamoDBClient.

const { Serial } = require('./drive');
const { LeaseLostError } = require('./errors');

/**
 * A live session. `deadline` is when everything held under it must stop acting, on the
 * `performance.now()` clock, whatever DynamoDB says (rule 2). Operations run one at a time.
 */
class Session {
  #table;
  #data;
  /** Leases claimed under this session and not given up: a renewal moves their deadline. */
  #leases = new Set();
  #serial = new Serial();
  /** Set by end() and by a renewal answered LeaseLostError: nothing acts under it any more. */
  #over = false;
  /** Whether it is over because it was lost (else ended). */
  #wasLost = false;

  constructor(table, data) {
    this.#table = table;
    this.#data = data;
  }

  get table() {
    return this.#table;
  }

  get owner() {
    return this.#data.owner;
  }

  /** The session item's fence: a new session of the same owner has a higher epoch. */
  get epoch() {
    return this.#data.epoch;
  }

  get expiresAtMs() {
    return this.#data.expiresAtMs;
  }

  /** When everything held under the session must stop acting: a `performance.now()` reading, ms. */
  get deadline() {
    return this.#data.deadline;
  }

  /** Milliseconds left before `deadline`, 0 once past. */
  timeLeft() {
    return Math.max(0, this.#data.deadline - this.#table.clock.mono());
  }

  toJSON() {
    return { ...this.#data };
  }

  /**
   * Extends the session: one write for everything held under it, whose deadlines move along.
   * With `load` (`{ held, maxConnections }`) the same write tells the fleet what this worker
   * holds (fleet-aware balance). LeaseLostError once the epoch is not the item's any more or
   * the deadline has passed.
   */
  renew({ signal, load } = {}) {
    return this.#serial.run(async () => {
      if (this.#over) {
        throw this.#lost();
      }
      try {
        this.#data = await this.#table._renewSession(this.#data, signal, load);
      } catch (e) {
        if (e instanceof LeaseLostError) {
          this.#overAll(true);
        }
        throw e;
      }
      for (const lease of this.#leases) {
        lease._cover(this.#data.deadline);
      }
      return this;
    });
  }

  /**
   * Ends the session (expiry 0) with one write: everything held under it is free at once.
   * `load` ({ held, maxConnections }): what the end frees, recorded in the same write.
   */
  end({ signal, load } = {}) {
    return this.#serial.run(async () => {
      // Whatever the answer, nothing acts under this session any more.
      this.#overAll(false);
      await this.#table._endSession(this.#data, signal, load);
    });
  }

  /**
   * Claims STARTED work `id` under this session: unowned work, or a dead session's (one
   * TransactWriteItems). LeaseHeldError while its holder's session lives. The lease's
   * checkpoint, fenced writes and release work as for any lease; its renew renews the session.
   * `signal` aborts the claim, and then cancels the lease as `using()`'s does (`Shutdown`: the
   * lease's own `signal` aborts with its reason); already aborted, nothing is sent.
   */
  async claim(id, { signal } = {}) {
    signal?.throwIfAborted();
    if (this.#over) {
      throw this.#lost();
    }
    const lease = await this.#table._claimInSession(id, this, this.#data, signal);
    // A renewal may have landed while the claim was in flight; the session may have ended.
    lease._cover(this.#data.deadline);
    lease._follow(signal);
    this.#leases.add(lease);
    if (this.#over) {
      this.#overAll(this.#wasLost);
    }
    return lease;
  }

  /**
   * The session is over (`lost`, or ended): every lease held under it stops acting at once (its
   * holder machine is told; its deadline passes), as the table already lets others take them.
   */
  #overAll(lost) {
    if (!this.#over) {
      [this.#over, this.#wasLost] = [true, lost];
    }
    for (const lease of this.#leases) {
      lease._sessionOver(this.#wasLost);
    }
    this.#leases.clear();
  }

  #lost() {
    const id = `session/${this.#data.owner}`;
    return new LeaseLostError(`the session of ${this.#data.owner} (epoch ${this.#data.epoch}) is over`, { id });
  }

  /** Internal: `lease` is no longer held under this session. */
  _forget(lease) {
    this.#leases.delete(lease);
  }
}

module.exports = { Session };
