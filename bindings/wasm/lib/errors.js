'use strict';
// The error classes, and the one place that makes them from what the Rust side reports
// (`{ kind, message, ...fields }`).

/** The root of every error leaselock throws. `kind` is the Rust variant's name. */
class LeaseLockError extends Error {
  constructor(message, kind, options) {
    super(message, options);
    this.name = new.target.name;
    this.kind = kind;
  }
}

/** Someone else holds an unexpired lease. */
class LeaseHeldError extends LeaseLockError {
  constructor(message, { owner, expiresAtMs }) {
    super(message, 'Held');
    this.owner = owner;
    this.expiresAtMs = expiresAtMs;
  }
}

/** The lease is no longer ours (taken over, released, or past the local deadline). */
class LeaseLostError extends LeaseLockError {
  constructor(message, { id, reason }) {
    super(message, 'Lost');
    this.id = id;
    /** Why a handler's signal aborted with it: `Lost` or `Deadline` (undefined otherwise). */
    this.reason = reason;
  }
}

/** The id has no item. */
class LeaseNotFoundError extends LeaseLockError {
  constructor(message, { id }) {
    super(message, 'NotFound');
    this.id = id;
  }
}

/** The work's desired state is STOPPED. */
class LeaseStoppedError extends LeaseLockError {
  constructor(message, { id, reason }) {
    super(message, 'Stopped');
    this.id = id;
    this.reason = reason;
  }
}

/** A checkpoint must move forward. */
class SeqNotIncreasingError extends LeaseLockError {
  constructor(message, { id, lastSeq, seq }) {
    super(message, 'SeqNotIncreasing');
    this.id = id;
    this.lastSeq = lastSeq;
    this.seq = seq;
  }
}

/** DynamoDB kept throttling until the retry budget ran out. */
class ThrottledError extends LeaseLockError {
  constructor(message) {
    super(message, 'Throttled');
  }
}

/** Bad input, refused before anything was written; `field` names the option or argument. */
class InvalidInputError extends LeaseLockError {
  constructor(message, { field }) {
    super(message, 'InvalidInput');
    this.field = field;
  }
}

/** Any other store failure; `cause` is the last SDK error, when there was one. */
class StoreError extends LeaseLockError {
  constructor(message, kind = 'Store', options) {
    super(message, kind, options);
  }
}

/** Every attempt timed out or failed on the server side until the budget ran out. */
class StoreTimeoutError extends StoreError {
  constructor(message, { outcomeUnknown }, options) {
    super(message, 'Timeout', options);
    /** True for a write that may have been applied. */
    this.outcomeUnknown = Boolean(outcomeUnknown);
  }
}

/** The store could not be reached (connection refused, DNS, TLS). */
class UnreachableError extends StoreError {
  constructor(message, _fields, options) {
    super(message, 'Unreachable', options);
  }
}

/** The credentials may not do this. */
class AccessDeniedError extends StoreError {
  constructor(message, _fields, options) {
    super(message, 'AccessDenied', options);
  }
}

/** The AWS client cannot send anything: no credentials or no region (the message names which). */
class NotConfiguredError extends StoreError {
  constructor(message, _fields, options) {
    super(message, 'NotConfigured', options);
  }
}

/** The table does not exist (or not in this region / account). */
class TableNotFoundError extends StoreError {
  constructor(message, { table }, options) {
    super(message, 'TableNotFound', options);
    this.table = table;
  }
}

/** A bug in leaselock: the wasm module trapped (a panic). No input should ever cause it. */
class InternalError extends LeaseLockError {
  constructor(message, options) {
    super(message, 'Internal', options);
  }
}

/** A worker's handler signal, aborted because the worker is shutting down. */
class ShutdownError extends LeaseLockError {
  constructor(message) {
    super(message, 'Shutdown');
    this.reason = 'Shutdown';
  }
}

/**
 * The error the Rust side reported (`{ kind, message, ...fields }`), as its class. `cause` is the
 * last SDK error of the operation, kept on store errors.
 */
function fromRust(e, cause) {
  const { kind, message } = e;
  const withCause = cause === undefined ? undefined : { cause };
  switch (kind) {
    case 'Held':
      return new LeaseHeldError(message, e);
    case 'Lost':
      return new LeaseLostError(message, e);
    case 'NotFound':
      return new LeaseNotFoundError(message, e);
    case 'Stopped':
      return new LeaseStoppedError(message, e);
    case 'SeqNotIncreasing':
      return new SeqNotIncreasingError(message, e);
    case 'Throttled':
      return new ThrottledError(message);
    case 'InvalidInput':
      return new InvalidInputError(message, e);
    case 'Timeout':
      return new StoreTimeoutError(message, e, withCause);
    case 'Unreachable':
      return new UnreachableError(message, e, withCause);
    case 'AccessDenied':
      return new AccessDeniedError(message, e, withCause);
    case 'NotConfigured':
      return new NotConfiguredError(message, e, withCause);
    case 'TableNotFound':
      return new TableNotFoundError(message, e, withCause);
    case 'Store':
      return new StoreError(message, 'Store', withCause);
    default:
      return new StoreError(`${kind}: ${message}`, 'Store', withCause);
  }
}

/** What a wasm function threw: the JSON text of an error, or a real exception (a bug). */
function fromWasm(thrown) {
  if (typeof thrown === 'string' && thrown.startsWith('{')) {
    return fromRust(JSON.parse(thrown));
  }
  // The last-resort guard: a trap (a panic in Rust) is reported as a bug, not passed on raw.
  if (thrown instanceof WebAssembly.RuntimeError) {
    return new InternalError(`internal error (a bug in leaselock): ${thrown.message}`, { cause: thrown });
  }
  return thrown;
}

/** The error JSON the decisions take back (`{ kind, message, id }`): `Store` for a non-leaselock error. */
function toRust(e) {
  const kind = e instanceof LeaseLockError ? e.kind : 'Store';
  return JSON.stringify({ kind, message: String(e?.message ?? e), id: e?.id });
}

/** Bad input found on the JavaScript side (an argument of the wrong type). */
function invalid(field, message) {
  return new InvalidInputError(`invalid ${field}: ${message}`, { field });
}

module.exports = {
  LeaseLockError,
  LeaseHeldError,
  LeaseLostError,
  LeaseNotFoundError,
  LeaseStoppedError,
  SeqNotIncreasingError,
  ThrottledError,
  InvalidInputError,
  StoreError,
  StoreTimeoutError,
  /** The older name of StoreTimeoutError (its `name` is StoreTimeoutError: not the DOM's TimeoutError). */
  TimeoutError: StoreTimeoutError,
  UnreachableError,
  AccessDeniedError,
  NotConfiguredError,
  TableNotFoundError,
  ShutdownError,
  InternalError,
  fromRust,
  fromWasm,
  toRust,
  invalid,
};
