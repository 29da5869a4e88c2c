// The reference streaming worker in Node: owns leased streams, connects to each ws_url, resumes
// after last_seq, writes every message to the messages table together with the checkpoint in
// one fenced transaction, and acknowledges the message upstream (as `leaselock worker` does).
//
//   leaselock table create && leaselock upstream &
//   leaselock start stream-1 --url ws://127.0.0.1:9100/stream-1
//   node examples/node_worker.mjs          # SIGTERM / Ctrl-C: graceful hand-over
//   node examples/node_worker.mjs --mode session   # one session heartbeat for every stream
//
// Settings come from the same environment variables as the CLI (LEASELOCK_TABLE,
// LEASELOCK_MESSAGES_TABLE, LEASELOCK_LEASE_MS, LEASELOCK_RENEW_MS, LEASELOCK_CLOCK_SKEW_MS,
// LEASELOCK_KEY_PREFIX, LEASELOCK_MODE, LEASELOCK_WORKER_ID, LEASELOCK_MAX_CONNECTIONS,
// LEASELOCK_QUEUE_URL, LEASELOCK_ORPHAN_INTERVAL_MS, LEASELOCK_DESIRED_STATE_INTERVAL_MS,
// LEASELOCK_NO_BALANCE, LEASELOCK_INDEX_NAME, LEASELOCK_OWNER_INDEX_NAME, LEASELOCK_ORPHAN_SHARDS,
// LEASELOCK_METRICS_INTERVAL_MS, LEASELOCK_METRICS_NAMESPACE, LEASELOCK_INDEX_LAG_MS,
// LEASELOCK_CLOCK_TOLERANCE_MS, LEASELOCK_NO_WAIT_FOR_STORE_CLOCK, LEASELOCK_OPERATION_BUDGET_MS,
// LEASELOCK_ALLOW_EVENTUAL_GLOBAL_TABLE),
// and the SDKs' own (AWS_REGION, AWS_ENDPOINT_URL, credentials).
import { createRequire } from 'node:module';

// The package and its dependencies resolve from bindings/wasm (the package is its own name there).
const require = createRequire(new URL('../bindings/wasm/package.json', import.meta.url));
const { DynamoDBClient } = require('@aws-sdk/client-dynamodb');
const { SQSClient } = require('@aws-sdk/client-sqs');
const WebSocket = require('ws');
const { LeaseTable, Worker } = require('leaselock');

const env = process.env;
const number = (name) => (env[name] === undefined ? undefined : Number(env[name]));
/** A boolean setting as the CLI reads it (set to 1, true, yes or on). */
const flag = (name) => /^(1|true|yes|on)$/i.test(env[name] ?? '');
const messagesTable = env.LEASELOCK_MESSAGES_TABLE ?? 'leaselock-messages';
// "per-item" (the default) or "session", as the CLI's --mode / LEASELOCK_MODE.
const modeFlag = process.argv.indexOf('--mode');
const mode = (modeFlag > 1 ? process.argv[modeFlag + 1] : env.LEASELOCK_MODE) ?? 'per-item';

const client = new DynamoDBClient({});
const table = new LeaseTable({
  client,
  tableName: env.LEASELOCK_TABLE ?? 'leases',
  leaseMs: number('LEASELOCK_LEASE_MS'),
  renewMs: number('LEASELOCK_RENEW_MS'),
  clockSkewMs: number('LEASELOCK_CLOCK_SKEW_MS'),
  keyPrefix: env.LEASELOCK_KEY_PREFIX,
  indexName: env.LEASELOCK_INDEX_NAME,
  ownerIndexName: env.LEASELOCK_OWNER_INDEX_NAME,
  orphanShards: number('LEASELOCK_ORPHAN_SHARDS'),
  operationBudgetMs: number('LEASELOCK_OPERATION_BUDGET_MS'),
  allowEventualGlobalTable: flag('LEASELOCK_ALLOW_EVENTUAL_GLOBAL_TABLE'),
  mode,
});

/** The messages table row of `msg`: one item per (stream, seq); `writes` counts deliveries. */
function messageWrite(msg, conn, workerId) {
  return {
    Update: {
      TableName: messagesTable,
      Key: { stream: { S: conn.id }, seq: { N: String(msg.seq) } },
      UpdateExpression: 'SET #data = :data, #fence = :fence, #worker = :worker, #at = :at ADD #writes :one',
      ExpressionAttributeNames: {
        '#data': 'data',
        '#fence': 'fence',
        '#worker': 'worker',
        '#at': 'written_at_ms',
        '#writes': 'writes',
      },
      ExpressionAttributeValues: {
        ':data': { S: msg.data },
        ':fence': { N: String(conn.fence) },
        ':worker': { S: workerId },
        // The store's clock, not this host's: stamps agree across the fleet.
        ':at': { N: String(conn.nowMs()) },
        ':one': { N: '1' },
      },
    },
  };
}

/** Streams one leased connection until its signal aborts. */
async function stream(conn, signal, workerId) {
  if (!conn.url) {
    throw new Error('the item has no ws_url');
  }
  let last = conn.lastSeq ?? 0;
  const target = `${conn.url}${conn.url.includes('?') ? '&' : '?'}from=${last}&fence=${conn.fence}`;
  const ws = new WebSocket(target, { handshakeTimeout: 5_000 });
  const closed = new Promise((resolve) => ws.once('close', resolve));
  const onAbort = () => ws.close();
  signal.addEventListener('abort', onAbort, { once: true });
  // A lease lost (or a shutdown) as the handler starts aborts before the listener is added.
  if (signal.aborted) {
    onAbort();
  }
  // Messages are handled one at a time, in order: the next waits for the last one's write.
  let chain = Promise.resolve();
  let failure;
  ws.on('message', (data) => {
    chain = chain.then(async () => {
      if (signal.aborted || failure) {
        return;
      }
      const msg = JSON.parse(data.toString());
      if (msg.seq <= last) {
        return;
      }
      if (msg.seq !== last + 1) {
        throw new Error(`upstream skipped from ${last} to ${msg.seq}`);
      }
      // The message and the checkpoint land together under the lease, or not at all.
      await conn.write([messageWrite(msg, conn, workerId)], { checkpoint: msg.seq });
      ws.send(JSON.stringify({ ack: msg.seq }));
      last = msg.seq;
    }).catch((e) => {
      failure ??= e;
      ws.close();
    });
  });
  ws.once('open', () => console.error(JSON.stringify({ message: 'streaming', connectionId: conn.id, fence: conn.fence, from: last })));
  ws.once('error', (e) => {
    failure ??= e;
  });
  await closed;
  signal.removeEventListener('abort', onAbort);
  await chain;
  if (failure && !signal.aborted) {
    throw failure;
  }
  if (!signal.aborted) {
    throw new Error('upstream closed the stream');
  }
}

const queueUrl = env.LEASELOCK_QUEUE_URL;
const worker = new Worker({
  table,
  sqs: queueUrl ? new SQSClient({}) : undefined,
  queueUrl,
  workerId: env.LEASELOCK_WORKER_ID,
  maxConnections: number('LEASELOCK_MAX_CONNECTIONS'),
  orphanIntervalMs: number('LEASELOCK_ORPHAN_INTERVAL_MS'),
  desiredStateIntervalMs: number('LEASELOCK_DESIRED_STATE_INTERVAL_MS'),
  metricsIntervalMs: number('LEASELOCK_METRICS_INTERVAL_MS'),
  metricsNamespace: env.LEASELOCK_METRICS_NAMESPACE,
  indexLagMs: number('LEASELOCK_INDEX_LAG_MS'),
  clockToleranceMs: number('LEASELOCK_CLOCK_TOLERANCE_MS'),
  waitForStoreClock: flag('LEASELOCK_NO_WAIT_FOR_STORE_CLOCK') ? false : undefined,
  // Session mode balances the fleet's work unless LEASELOCK_NO_BALANCE is set (as the CLI's).
  balance: flag('LEASELOCK_NO_BALANCE') ? false : undefined,
  handler: (conn, signal) => stream(conn, signal, worker.workerId),
});
console.error(`worker ${worker.workerId}: running`);
const snapshot = await worker.run();
console.error(`worker ${snapshot.workerId}: stopped, ${JSON.stringify(snapshot)}`);
// Every lease is released; a handler that ignored its signal was left behind by the worker and
// must not keep the process alive.
process.exit(0);
