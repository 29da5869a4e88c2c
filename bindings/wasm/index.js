'use strict';
// leaselock for Node: exactly-one ownership of long-lived work through DynamoDB leases.
// The lease protocol and the worker's decisions run in WebAssembly (built from the Rust core);
// the I/O goes through the DynamoDBClient / SQSClient you pass in.

const errors = require('./lib/errors');
const { LeaseTable, Lease } = require('./lib/table');
const { Session } = require('./lib/session');
const { Worker, Connection, defaultWorkerId } = require('./lib/worker');

module.exports = {
  LeaseTable,
  Lease,
  Session,
  Worker,
  Connection,
  defaultWorkerId,
  LeaseLockError: errors.LeaseLockError,
  LeaseHeldError: errors.LeaseHeldError,
  LeaseLostError: errors.LeaseLostError,
  LeaseNotFoundError: errors.LeaseNotFoundError,
  LeaseStoppedError: errors.LeaseStoppedError,
  SeqNotIncreasingError: errors.SeqNotIncreasingError,
  ThrottledError: errors.ThrottledError,
  InvalidInputError: errors.InvalidInputError,
  StoreError: errors.StoreError,
  StoreTimeoutError: errors.StoreTimeoutError,
  // The older name, kept: the class's `name` is StoreTimeoutError, which the DOMException that
  // AbortSignal.timeout() rejects with (name TimeoutError) cannot be mistaken for.
  TimeoutError: errors.StoreTimeoutError,
  UnreachableError: errors.UnreachableError,
  AccessDeniedError: errors.AccessDeniedError,
  NotConfiguredError: errors.NotConfiguredError,
  TableNotFoundError: errors.TableNotFoundError,
  ShutdownError: errors.ShutdownError,
  InternalError: errors.InternalError,
};

// Leader, group and strategic election (the same keys and decisions as the Rust and Python electors).
const election = require('./lib/election');

module.exports.LeaderElector = election.LeaderElector;
module.exports.Term = election.Term;
