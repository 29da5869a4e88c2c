// Types of the public API. The data shapes shared with the Rust core (LeaseItem, LeaseData,
// AttributeNames, CancelReason, ErrorKind, DesiredState) come from the wasm module's one
// typescript_custom_section.
import type { DynamoDBClient, TransactWriteItem } from '@aws-sdk/client-dynamodb';
import type { SQSClient } from '@aws-sdk/client-sqs';
import type {
  AttributeNames,
  CancelReason,
  DesiredState,
  ErrorKind,
  LeaseData,
  LeaseItem,
} from './pkg/leaselock_wasm.js';

export type { AttributeNames, CancelReason, DesiredState, ErrorKind, LeaseData, LeaseItem };

export interface Abortable {
  /** Aborts the operation (it rejects with the signal's reason). */
  signal?: AbortSignal;
}

export interface LeaseTableOptions {
  client: DynamoDBClient;
  tableName: string;
  /** How long a claim or renewal holds the lease (default 20000). */
  leaseMs?: number;
  /** How often an owner renews (default 5000). */
  renewMs?: number;
  /** The largest wall-clock difference tolerated between any two workers (default 1000). */
  clockSkewMs?: number;
  /** Prepended to every id written (several applications can share a table). */
  keyPrefix?: string;
  /** The orphan index (default `desired_state-lease_expires_at_ms-index`). */
  indexName?: string;
  /** The owner index, keys only, for session mode's takeovers (default `lease_owner-index`). */
  ownerIndexName?: string;
  /**
   * The retry budget of an operation that holds no lease (start, stop, get, listings,
   * createTable), so a store slow for a moment does not fail it (default 10000). Lease
   * operations keep theirs: the deadline, or one renew interval.
   */
  operationBudgetMs?: number;
  /** How long one attempt of such an operation may take (default 5000). */
  operationAttemptTimeoutMs?: number;
  attributeNames?: AttributeNames;
  /**
   * "per-item" (default): every held item is renewed; "session": one session item per worker.
   * "item" is the older spelling of "per-item", still accepted.
   */
  mode?: 'per-item' | 'item' | 'session';
  /**
   * Orphan-index partition values running work is spread over, 1 to 256 (default 1: the
   * reference schema's single `STARTED`; N > 1 writes `STARTED#k`). Every writer of a table
   * must use the same count.
   */
  orphanShards?: number;
  /**
   * Accept a global table in multi-Region eventual consistency, where writes in two Regions
   * resolve last-writer-wins (default false: refused by `checkTable`). Only safe when every
   * writer of the table writes in one Region; nothing is described then.
   */
  allowEventualGlobalTable?: boolean;
}

/** What `LeaseTable.checkTable` found. */
export type TableReplication =
  | { kind: 'single-region' }
  /** A global table in multi-Region strong consistency (MRSC). */
  | { kind: 'strong'; regions: string[] }
  /** `allowEventualGlobalTable`: not described. */
  | { kind: 'not-checked' };

/** A stored session item; `expiresAtMs` 0 once ended. */
export interface SessionItem {
  owner: string;
  epoch: number;
  expiresAtMs: number;
  /** What the session reported at its last renewal (balancing workers), when it did. */
  heldConnections?: number;
  maxConnections?: number;
}

/** What a session renewal reports for the fleet's balance. */
export interface SessionLoad {
  held: number;
  maxConnections: number;
}

/** Session mode: one worker's session (one epoch of its session item). */
export declare class Session {
  readonly table: LeaseTable;
  readonly owner: string;
  readonly epoch: number;
  readonly expiresAtMs: number;
  /** When everything held under the session must stop acting: a `performance.now()` reading, ms. */
  readonly deadline: number;
  /** Milliseconds left before `deadline` (`deadline - performance.now()`), 0 once past. */
  timeLeft(): number;
  /**
   * One write for everything held under it; LeaseLostError once it is gone or taken over,
   * and then every lease held under it stops acting at once (its `deadline` passes).
   * With `load` the same write reports what the worker holds (fleet-aware balance).
   */
  renew(options?: Abortable & { load?: SessionLoad }): Promise<this>;
  /**
   * Expiry 0 with one write: everything held under it is free at once, and stops acting
   * (every lease's `deadline` passes; whatever the answer, the session takes no more claims).
   */
  end(options?: Abortable & { load?: SessionLoad }): Promise<void>;
  /**
   * Claims STARTED work (a dead session's by one transaction); LeaseHeldError while held.
   * `signal` aborts the claim, and once it is held cancels the lease as `using()`'s does: the
   * lease's `signal` aborts with its reason (`cancelReason` `Shutdown`). Already aborted, it
   * rejects with its reason and nothing is sent.
   */
  claim(id: string, options?: Abortable): Promise<Lease>;
  toJSON(): SessionItem & { deadline: number };
}

/**
 * The store's clock against this host's, measured from the `date` header of the table's
 * answers: the true offset is within `uncertaintyMs` of `offsetMs`.
 */
export interface ClockEstimate {
  /** The store's clock minus this host's wall clock. */
  offsetMs: number;
  uncertaintyMs: number;
  /** The answers it rests on. */
  samples: number;
}

export declare class LeaseTable {
  constructor(options: LeaseTableOptions);
  readonly client: DynamoDBClient;
  readonly tableName: string;
  readonly leaseMs: number;
  readonly renewMs: number;
  readonly clockSkewMs: number;
  readonly mode: 'per-item' | 'session';
  readonly orphanShards: number;
  readonly allowEventualGlobalTable: boolean;
  createTable(options?: Abortable): Promise<void>;
  /**
   * Whether leases on the table can be exclusive, asked once per LeaseTable before its first
   * claim (one DescribeTable; a success is kept). A global table in multi-Region eventual
   * consistency rejects with InvalidInputError (field `table`), a missing one with
   * TableNotFoundError.
   */
  checkTable(options?: Abortable): Promise<TableReplication>;
  /** The store's clock against this host's as measured so far from the table's answers. */
  clockEstimate(): ClockEstimate | undefined;
  /**
   * Measures the store's clock until it is known within `withinMs` (default half the clock
   * skew): at most 12 DescribeTable requests, each sent when its answer narrows it most.
   */
  measureClock(options?: { withinMs?: number } & Abortable): Promise<ClockEstimate | undefined>;
  start(id: string, url: string, options?: Abortable): Promise<LeaseItem>;
  stop(id: string, options?: Abortable): Promise<LeaseItem>;
  acquire(id: string, options: { owner: string } & Abortable): Promise<Lease>;
  acquireStarted(id: string, options: { owner: string } & Abortable): Promise<Lease>;
  get(id: string, options?: Abortable): Promise<LeaseItem | null>;
  orphans(options?: { limit?: number; cutoffMs?: number } & Abortable): Promise<LeaseItem[]>;
  desiredStates(ids: string[], options?: Abortable): Promise<Map<string, DesiredState | null>>;
  ownedBy(owner: string, options?: Abortable): Promise<LeaseItem[]>;
  items(options?: Abortable): Promise<LeaseItem[]>;
  /** Session mode: a new epoch of `owner`'s session. */
  createSession(owner: string, options?: { previousEpoch?: number } & Abortable): Promise<Session>;
  /** Session items (all, or those expiring below `belowMs`), oldest expiry first. */
  sessions(options?: { belowMs?: number } & Abortable): Promise<SessionItem[]>;
  using<T>(
    id: string,
    options: { owner: string } & Abortable,
    routine: (lease: Lease, signal: AbortSignal) => Promise<T>,
  ): Promise<T>;
}

export declare class Lease {
  readonly table: LeaseTable;
  readonly id: string;
  readonly owner: string;
  readonly fence: number;
  readonly expiresAtMs: number;
  readonly lastSeq: number | null;
  readonly url: string | null;
  readonly desiredState: DesiredState | null;
  /**
   * When the owner must stop acting for the lease: a `performance.now()` reading, ms (the instant
   * Rust's `Lease::deadline()` and Python's `lease.deadline` name on their monotonic clocks).
   */
  readonly deadline: number;
  /** Milliseconds left before `deadline` (`deadline - performance.now()`), 0 once past. */
  timeLeft(): number;
  /** Session mode: the session the lease is held under. */
  readonly session?: Session;
  /**
   * Session mode: aborts when the lease stops: at its deadline, when its session is lost or
   * ended, when it is released, and when the signal given to `Session.claim` aborts (with that
   * signal's reason), as `using()`'s signal does. Undefined for a per-item lease.
   */
  readonly signal?: AbortSignal;
  /** Session mode: the CancelReason `signal` aborted for, undefined while it has not. */
  readonly cancelReason?: CancelReason;
  /** Under a session, renews the session. */
  renew(options?: Abortable): Promise<this>;
  checkpoint(seq: number, options?: Abortable): Promise<this>;
  release(options?: Abortable): Promise<void>;
  write(writes: TransactWriteItem[], options?: { checkpoint?: number } & Abortable): Promise<this>;
  toJSON(): LeaseData;
  [Symbol.asyncDispose](): Promise<void>;
}

export declare class Connection {
  readonly id: string;
  readonly fence: number;
  readonly owner: string;
  readonly url: string | null;
  readonly lastSeq: number | null;
  /** When the worker must stop acting for the work: a `performance.now()` reading, ms. */
  readonly deadline: number;
  /** Milliseconds left before `deadline`, 0 once past. */
  timeLeft(): number;
  readonly lease: Lease;
  readonly signal: AbortSignal;
  /** The store's time now (epoch ms), measured from DynamoDB's answers: stamp writes with it. */
  nowMs(): number;
  checkpoint(seq: number, options?: Abortable): Promise<Lease>;
  write(writes: TransactWriteItem[], options?: { checkpoint?: number } & Abortable): Promise<Lease>;
}

export interface WorkerOptions {
  table: LeaseTable;
  handler: (conn: Connection, signal: AbortSignal) => Promise<unknown>;
  /** START hints (optional: the orphan index finds work without them). */
  sqs?: SQSClient;
  queueUrl?: string;
  /** Most leases held at once (default 700). */
  maxConnections?: number;
  /** Owner name written into leases (default host-pid-random). */
  workerId?: string;
  orphanIntervalMs?: number;
  desiredStateIntervalMs?: number;
  /** How long an aborted handler may take to return before its lease is released (default 5000). */
  handlerGraceMs?: number;
  /** The hint queue's long-poll wait (default 5000, at most 20000). */
  hintWaitMs?: number;
  /**
   * Session mode: how far behind the table the owner index may be, ms (default 10000). A dead
   * session whose work the index does not list is retired only once a listing sent this long
   * after its last write lists nothing.
   */
  indexLagMs?: number;
  /** How often a metrics line (CloudWatch EMF, as the Rust worker's) is written (default 60000). */
  metricsIntervalMs?: number;
  /** The metrics' CloudWatch namespace (default "leaselock"). */
  metricsNamespace?: string;
  /** Where the metrics lines go (default: one line each to stdout). */
  metrics?: (line: string) => void;
  /**
   * Session mode: report the load in every session renewal, claim no more than the fair share
   * of the fleet's work and hand the excess over (default true).
   */
  balance?: boolean;
  /**
   * Claims wait until the store's clock (measured from the table's answers) is known within
   * this, ms (default half the clock skew); the worker keeps what it holds meanwhile.
   */
  clockToleranceMs?: number;
  /** Whether claims wait for the store's clock (default true). */
  waitForStoreClock?: boolean;
  logger?: {
    warn(message: string, fields?: object): void;
    info?(message: string, fields?: object): void;
    error?(message: string, fields?: object): void;
  };
}

export interface WorkerSnapshot {
  workerId: string;
  maxConnections: number;
  held: string[];
  acquired: number;
  acquireConflicts: number;
  acquireErrors: number;
  leasesLost: number;
  released: number;
  /** Connections released and hinted because this worker was above its fair share. */
  handedOver: number;
  handlerErrors: number;
  orphanPolls: number;
  hintsReceived: number;
  /** Session mode: the live session's epoch (null between epochs). */
  sessionEpoch?: number | null;
  /** Session mode: connections claimed from dead sessions. */
  sessionTakeovers?: number;
  /** Session mode: transactions that took several of a dead session's connections at once. */
  takeoverTransactions?: number;
  /** Session mode with balance: the most held after claiming (the fair share); else null. */
  claimLimit?: number | null;
  stopping: boolean;
  /** The store's clock minus this host's, as last measured (null: not yet). */
  clockOffsetMs: number | null;
  clockUncertaintyMs: number | null;
  /** Why the worker claims nothing now (it keeps what it holds), if it does not. */
  claimsPaused: string | null;
}

export declare class Worker {
  constructor(options: WorkerOptions);
  readonly workerId: string;
  snapshot(): WorkerSnapshot;
  shutdown(): void;
  /** Resolves after a graceful shutdown (SIGTERM, SIGINT, `signal` or `shutdown()`). */
  run(options?: Abortable): Promise<WorkerSnapshot>;
}

export declare function defaultWorkerId(): string;

export declare class LeaseLockError extends Error {
  readonly kind: ErrorKind | 'Shutdown' | 'Released';
}
export declare class LeaseHeldError extends LeaseLockError {
  readonly owner: string;
  readonly expiresAtMs: number;
}
export declare class LeaseLostError extends LeaseLockError {
  readonly id: string;
  /** Set on a handler signal's reason: `Lost` or `Deadline`. */
  readonly reason?: CancelReason;
}
export declare class LeaseNotFoundError extends LeaseLockError {
  readonly id: string;
}
export declare class LeaseStoppedError extends LeaseLockError {
  readonly id: string;
  readonly reason?: CancelReason;
}
export declare class SeqNotIncreasingError extends LeaseLockError {
  readonly id: string;
  readonly lastSeq: number;
  readonly seq: number;
}
export declare class ThrottledError extends LeaseLockError {}
export declare class InvalidInputError extends LeaseLockError {
  /** The option or argument that was refused (`leaseMs`, `id`, `attributeNames.fence`, ...). */
  readonly field: string;
}
export declare class StoreError extends LeaseLockError {
  /** The last SDK error, when there was one. */
  readonly cause?: unknown;
}
/** No answer in time (`name`: "StoreTimeoutError", never the DOM's "TimeoutError"). */
export declare class StoreTimeoutError extends StoreError {
  /** True for a write that may have been applied. */
  readonly outcomeUnknown: boolean;
}
/** The older name of StoreTimeoutError (the same class). */
export { StoreTimeoutError as TimeoutError };
export declare class UnreachableError extends StoreError {}
export declare class AccessDeniedError extends StoreError {}
/** No AWS credentials or no region: the message names which; thrown at once, nothing was sent. */
export declare class NotConfiguredError extends StoreError {}
export declare class TableNotFoundError extends StoreError {
  readonly table: string;
}
export declare class ShutdownError extends LeaseLockError {
  readonly reason: 'Shutdown';
}
/** A bug in leaselock (the wasm module trapped); no input should ever cause it. */
export declare class InternalError extends LeaseLockError {}

// Leader, group and strategic election.

export interface LeaderElectorOptions {
  /** The lease table to elect in; or give `client` + `tableName` (and its timing) instead. */
  table?: LeaseTable;
  client?: DynamoDBClient;
  tableName?: string;
  leaseMs?: number;
  renewMs?: number;
  clockSkewMs?: number;
  allowEventualGlobalTable?: boolean;
  /** Unique per process; default host-pid-random. */
  owner?: string;
  /** How long a contender keeps retrying before it is skipped (default 0: one try). */
  waitMs?: number;
  /** The lease is kept at least this long after the claim, even after a short action. */
  minLeaseMs?: number;
  /** Prepended to the election keys (`{keyPrefix}leader/{name}`, `{keyPrefix}group/{name}#slot-{i}`). */
  keyPrefix?: string;
  /** Pause between claim attempts, jittered to between half of it and all of it (default 200). */
  retryDelayMs?: number;
  /** Strategic elections: how often the leader asks the strategy again (default: the lease). */
  termMs?: number;
  /** Strategic elections: how long a registration lasts without a refresh (default: the lease). */
  candidateTtlMs?: number;
}

/** What an elected action is handed. `signal` aborts when the term is over. */
export declare class Term {
  readonly fence: number;
  readonly lease: Lease;
  readonly key: string;
  /** The slot held, for group elections; otherwise null. */
  readonly slot: number | null;
  /** The local deadline: a `performance.now()` reading, ms. */
  readonly deadline: number;
  /** Milliseconds left before `deadline`, 0 once past. */
  timeLeft(): number;
  readonly signal: AbortSignal;
  readonly cancelled: boolean;
}

export type TermEnd = 'Finished' | 'Lost' | 'SteppedDown';

export type ElectionOutcome<T> =
  | { led: true; skipped: false; fence: number; value: T; end: TermEnd }
  | { led: false; skipped: true; holder: string | null };

export type ElectionStrategy = 'HighestScore' | 'LeastLoaded' | { preferredNode: string };

export interface CandidateInfo {
  /** Higher is better for HighestScore. */
  score?: number;
  /** Lower is better for LeastLoaded. */
  load?: number;
  metadata?: Record<string, string>;
}

export declare class LeaderElector {
  constructor(options: LeaderElectorOptions);
  readonly owner: string;
  readonly table: LeaseTable;
  leaderKey(name: string): string;
  runIfLeader<T>(
    name: string,
    action: (term: Term, signal: AbortSignal) => Promise<T> | T,
    options?: { signal?: AbortSignal },
  ): Promise<ElectionOutcome<T>>;
  runIfSlot<T>(
    name: string,
    slots: number,
    action: (term: Term, signal: AbortSignal) => Promise<T> | T,
    options?: { signal?: AbortSignal },
  ): Promise<ElectionOutcome<T>>;
  runIfElected<T>(
    name: string,
    candidate: CandidateInfo,
    strategy: ElectionStrategy,
    action: (term: Term, signal: AbortSignal) => Promise<T> | T,
    options?: { signal?: AbortSignal },
  ): Promise<ElectionOutcome<T>>;
}
