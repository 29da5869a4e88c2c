// Type-checked with `tsc --noEmit -p tests/types` (test.sh): uses every type index.d.ts exports,
// so a declaration that drifts from the package (a renamed option, a removed class) fails here.
import { DynamoDBClient } from '@aws-sdk/client-dynamodb';
import { SQSClient } from '@aws-sdk/client-sqs';
import {
  AccessDeniedError,
  Connection,
  defaultWorkerId,
  InternalError,
  InvalidInputError,
  Lease,
  LeaseHeldError,
  LeaseLockError,
  LeaseLostError,
  LeaseNotFoundError,
  LeaseStoppedError,
  LeaseTable,
  LeaderElector,
  NotConfiguredError,
  SeqNotIncreasingError,
  Session,
  ShutdownError,
  StoreError,
  StoreTimeoutError,
  TableNotFoundError,
  Term,
  ThrottledError,
  TimeoutError,
  UnreachableError,
  Worker,
} from '../../index.js';
import type {
  Abortable,
  AttributeNames,
  CancelReason,
  CandidateInfo,
  ClockEstimate,
  DesiredState,
  ElectionOutcome,
  ElectionStrategy,
  ErrorKind,
  LeaderElectorOptions,
  LeaseData,
  LeaseItem,
  LeaseTableOptions,
  SessionItem,
  SessionLoad,
  TableReplication,
  TermEnd,
  WorkerOptions,
  WorkerSnapshot,
} from '../../index.js';

const attributeNames: AttributeNames = { owner: 'lease_owner', fence: 'fence' };
const tableOptions: LeaseTableOptions = {
  client: new DynamoDBClient({}),
  tableName: 'leases',
  leaseMs: 20_000,
  mode: 'per-item',
  attributeNames,
  orphanShards: 1,
  allowEventualGlobalTable: false,
  indexName: 'desired_state-lease_expires_at_ms-index',
  ownerIndexName: 'lease_owner-index',
  operationBudgetMs: 10_000,
  operationAttemptTimeoutMs: 5_000,
};
const table = new LeaseTable(tableOptions);
const sessions = new LeaseTable({ ...tableOptions, mode: 'session' });
const legacy = new LeaseTable({ ...tableOptions, mode: 'item' });
const mode: 'per-item' | 'session' = legacy.mode;
const shards: number = table.orphanShards;
const optedIn: boolean = table.allowEventualGlobalTable;

async function leases(signal: AbortSignal): Promise<void> {
  const abortable: Abortable = { signal };
  const replication: TableReplication = await table.checkTable(abortable);
  const regions: string[] = replication.kind === 'strong' ? replication.regions : [];
  const measured: ClockEstimate | undefined = await table.measureClock({ withinMs: 100, ...abortable });
  const offset: number | undefined = (measured ?? table.clockEstimate())?.offsetMs;
  const lease: Lease = await table.acquire('a', { owner: 'w', ...abortable });
  const data: LeaseData = lease.toJSON();
  const state: DesiredState | null = data.desiredState;
  const item: LeaseItem | null = await table.get('a');
  const states: Map<string, DesiredState | null> = await table.desiredStates(['a']);
  await lease.checkpoint(1);
  await lease.write([], { checkpoint: 2 });
  const fence: number = await table.using('b', { owner: 'w' }, async (held: Lease, s: AbortSignal) => held.fence + Number(s.aborted));
  const session: Session = await sessions.createSession('w');
  const load: SessionLoad = { held: 1, maxConnections: 700 };
  await session.renew({ load });
  const claimed: Lease = await session.claim('c', { signal: new AbortController().signal });
  const stopping: AbortSignal | undefined = claimed.signal;
  const why: CancelReason | undefined = claimed.cancelReason;
  const listed: SessionItem[] = await sessions.sessions();
  await session.end({ load });
  console.log(mode, shards, state, item, states, fence, listed, lease.session?.epoch, regions, offset, stopping?.aborted, why);
}

async function worker(): Promise<WorkerSnapshot> {
  const handler = async (conn: Connection, signal: AbortSignal): Promise<void> => {
    await conn.checkpoint((conn.lastSeq ?? 0) + 1, { signal });
    const reason: CancelReason | undefined = (signal.reason as LeaseLostError).reason;
    const left: number = conn.timeLeft() + conn.lease.timeLeft() + (conn.lease.session?.timeLeft() ?? 0);
    console.log(conn.id, conn.fence, conn.url, conn.deadline, left, conn.lease.id, reason);
  };
  const options: WorkerOptions = {
    table: sessions,
    handler,
    sqs: new SQSClient({}),
    queueUrl: 'https://sqs.us-east-1.amazonaws.com/123456789012/hints',
    workerId: defaultWorkerId(),
    maxConnections: 10,
    orphanIntervalMs: 2_000,
    desiredStateIntervalMs: 10_000,
    handlerGraceMs: 5_000,
    hintWaitMs: 5_000,
    metricsIntervalMs: 60_000,
    metricsNamespace: 'leaselock',
    metrics: (line: string) => console.log(line),
    balance: true,
    clockToleranceMs: 500,
    waitForStoreClock: true,
    logger: { warn: console.warn, info: console.info, error: console.error },
  };
  const w = new Worker(options);
  const snapshot: WorkerSnapshot = w.snapshot();
  const limit: number | null | undefined = snapshot.claimLimit;
  const clock: [number | null, number | null, string | null] = [
    snapshot.clockOffsetMs,
    snapshot.clockUncertaintyMs,
    snapshot.claimsPaused,
  ];
  console.log(w.workerId, limit, snapshot.handedOver, clock);
  w.shutdown();
  return w.run();
}

async function election(): Promise<void> {
  const options: LeaderElectorOptions = { table, owner: 'w', waitMs: 0 };
  const elector = new LeaderElector(options);
  const action = async (term: Term, signal: AbortSignal) => term.fence + Number(signal.aborted) + term.timeLeft();
  const led: ElectionOutcome<number> = await elector.runIfLeader('jobs', action);
  const strategy: ElectionStrategy = { preferredNode: 'w' };
  const candidate: CandidateInfo = { score: 1, load: 0, metadata: { zone: 'a' } };
  const elected = await elector.runIfElected('jobs', candidate, strategy, action);
  const end: TermEnd | undefined = led.led ? led.end : undefined;
  console.log(elected.led, end);
}

function errors(e: unknown): string {
  const kinds: ErrorKind[] = ['Held', 'Lost', 'Timeout'];
  if (e instanceof StoreTimeoutError) {
    const same: TimeoutError = e;
    return `${same.name} ${same.outcomeUnknown}`;
  }
  if (e instanceof LeaseHeldError) return `${e.owner} ${e.expiresAtMs}`;
  if (e instanceof LeaseLostError) return e.id;
  if (e instanceof LeaseNotFoundError) return e.id;
  if (e instanceof LeaseStoppedError) return e.id;
  if (e instanceof SeqNotIncreasingError) return `${e.lastSeq} ${e.seq}`;
  if (e instanceof InvalidInputError) return e.field;
  if (e instanceof TableNotFoundError) return e.table;
  if (e instanceof ShutdownError) return e.reason;
  const classes = [ThrottledError, UnreachableError, AccessDeniedError, NotConfiguredError, InternalError, StoreError];
  if (classes.some((c) => e instanceof c) && e instanceof LeaseLockError) return e.kind;
  return kinds.join();
}

export { leases, worker, election, errors };
