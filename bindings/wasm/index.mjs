// The ES module entry: the same classes as the CommonJS one (one copy, so `instanceof` holds
// across both).
import leaselock from './index.js';

export const {
  LeaseTable,
  Lease,
  Session,
  Worker,
  Connection,
  defaultWorkerId,
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
  TimeoutError,
  UnreachableError,
  AccessDeniedError,
  NotConfiguredError,
  TableNotFoundError,
  ShutdownError,
  InternalError,
} = leaselock;
export const { LeaderElector, Term } = leaselock;
export default leaselock;
