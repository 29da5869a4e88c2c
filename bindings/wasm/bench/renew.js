'use strict';
// Client CPU per renew: a renewal through leaselock (wasm protocol + the SDK) against the same
// UpdateItem sent directly with @aws-sdk/client-dynamodb, side by side in one process, against a
// keep-alive loopback endpoint with a canned answer (canned-dynamodb.js, in a child process so
// its CPU is not counted). The .wasm's size and load time: size.js (make bench-wasm).
// Merges node_cpu_us_per_renew, jssdk_cpu_us_per_renew (and the ratio and the protocol's own CPU
// with an in-memory client) into
// bench/results/latest.json at the repository root (read, update, write: other sections' keys stay).
// With LEASELOCK_BENCH_BASELINE=<directory of another built copy of this package>, that copy's
// renewal is measured in the same rounds too (before/after a change, side by side in one run).
const { fork, execFileSync } = require('node:child_process');
const path = require('node:path');
const { DynamoDBClient, UpdateItemCommand } = require('@aws-sdk/client-dynamodb');
const { LeaseTable } = require('..');

const ROUNDS = Number(process.env.LEASELOCK_BENCH_ROUNDS ?? 11);
const PER_ROUND = Number(process.env.LEASELOCK_BENCH_RENEWS ?? 500);
const root = path.resolve(__dirname, '../../..');

const now = Date.now();
const answer = JSON.stringify({
  Attributes: {
    connection_id: { S: 'bench-1' },
    lease_owner: { S: 'bench-worker' },
    lease_expires_at_ms: { N: String(now + 20_000) },
    fence: { N: '7' },
    desired_state: { S: 'STARTED' },
    ws_url: { S: 'ws://127.0.0.1:9100/bench-1' },
    last_seq: { N: '41' },
  },
});

/** User-mode CPU per call of each measured function, by round (the kernel's loopback work and
 * whatever other loopback traffic it absorbs stay out of it). */
const userUs = new Map();

function cpuUs(fn) {
  return async (n) => {
    const start = process.cpuUsage();
    for (let i = 0; i < n; i++) {
      await fn();
    }
    const used = process.cpuUsage(start);
    userUs.set(fn, [...(userUs.get(fn) ?? []), used.user / n]);
    return (used.user + used.system) / n;
  };
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

async function main() {
  const server = fork(path.join(__dirname, 'canned-dynamodb.js'), [answer], { stdio: 'inherit' });
  const { port } = await new Promise((resolve) => server.once('message', resolve));
  try {
    const client = new DynamoDBClient({
      endpoint: `http://127.0.0.1:${port}`,
      region: 'us-east-1',
      credentials: { accessKeyId: 'bench', secretAccessKey: 'bench' },
    });
    // A long lease: a loaded machine's wall time between two renewals of one lease (other
    // variants run in between) must not reach its deadline. The canned endpoint answers
    // UpdateItem only: the table check before the first claim is not sent.
    const LONG = { tableName: 'bench', leaseMs: 3_600_000, allowEventualGlobalTable: true };
    const table = new LeaseTable({ client, ...LONG });
    const lease = await table.acquire('bench-1', { owner: 'bench-worker' });
    // The exact UpdateItem a renewal sends, taken from the protocol itself.
    const op = table.rules.renew(JSON.stringify(lease));
    const step = JSON.parse(op.resume(Date.now(), performance.now(), 0.5));
    op.free();
    const input = step.request.UpdateItem;
    const renewOurs = () => lease.renew();
    const sendDirect = () => client.send(new UpdateItemCommand(input));
    const viaLeaselock = cpuUs(renewOurs);
    const direct = cpuUs(sendDirect);
    let viaBaseline;
    let renewBaseline;
    if (process.env.LEASELOCK_BENCH_BASELINE) {
      const Baseline = require(path.resolve(process.env.LEASELOCK_BENCH_BASELINE)).LeaseTable;
      const old = await new Baseline({ client, ...LONG }).acquire('bench-1', { owner: 'bench-worker' });
      renewBaseline = () => old.renew();
      viaBaseline = cpuUs(renewBaseline);
      await viaBaseline(1000);
    }
    await viaLeaselock(1000);
    await direct(1000);
    const ours = [];
    const sdk = [];
    const baseline = [];
    for (let r = 0; r < ROUNDS; r++) {
      if (viaBaseline) {
        baseline.push(await viaBaseline(PER_ROUND));
      }
      ours.push(await viaLeaselock(PER_ROUND));
      sdk.push(await direct(PER_ROUND));
    }
    // What leaselock adds with no I/O at all: a client that answers from memory.
    const canned = JSON.parse(answer);
    const inMemory = new LeaseTable({ client: { send: async () => canned }, tableName: 'bench', allowEventualGlobalTable: true });
    const memLease = await inMemory.acquire('bench-1', { owner: 'bench-worker' });
    const overhead = cpuUs(() => memLease.renew());
    await overhead(2000);
    const overheads = [];
    for (let r = 0; r < ROUNDS; r++) {
      overheads.push(await overhead(PER_ROUND * 4));
    }
    if (process.env.LEASELOCK_BENCH_VERBOSE) console.log({ ours, sdk, baseline });
    // The warm-up call is the first entry of each.
    const userOurs = median(userUs.get(renewOurs).slice(1));
    const userSdk = median(userUs.get(sendDirect).slice(1));
    if (viaBaseline) {
      const b = median(baseline);
      const bUser = median(userUs.get(renewBaseline).slice(1));
      console.log(
        `before/after (same rounds): baseline ${b.toFixed(1)} us (${(b / median(sdk)).toFixed(3)}x), ` +
          `this build ${median(ours).toFixed(1)} us (${(median(ours) / median(sdk)).toFixed(3)}x), direct SDK ${median(sdk).toFixed(1)} us; ` +
          `user-mode only: baseline ${(bUser / userSdk).toFixed(3)}x, this build ${(userOurs / userSdk).toFixed(3)}x`,
      );
    }
    const results = {
      node_cpu_us_per_renew: Number(median(ours).toFixed(1)),
      jssdk_cpu_us_per_renew: Number(median(sdk).toFixed(1)),
      node_renew_cpu_ratio: Number((median(ours) / median(sdk)).toFixed(3)),
      node_protocol_cpu_us_per_renew: Number(median(overheads).toFixed(1)),
      node_renew_user_cpu_ratio: Number((userOurs / userSdk).toFixed(3)),
    };
    // Merged key by key into bench/results/latest.json by the helper every section uses.
    const out = path.join(root, 'bench/results/latest.json');
    execFileSync('python3', [path.join(root, 'bench/merge.py')], { input: JSON.stringify(results), stdio: ['pipe', 'inherit', 'inherit'] });
    console.log(
      `node renew: ${results.node_cpu_us_per_renew} us CPU via leaselock, ${results.jssdk_cpu_us_per_renew} us ` +
        `direct (${results.node_renew_cpu_ratio}x, target <= 1.3x; ${ROUNDS} rounds x ${PER_ROUND}, medians); ` +
        `protocol alone (in-memory client) ${results.node_protocol_cpu_us_per_renew} us; ` +
        `user-mode CPU only: ${userOurs.toFixed(1)} vs ${userSdk.toFixed(1)} us (${results.node_renew_user_cpu_ratio}x)`,
    );
    console.log(`written to ${path.relative(root, out)}`);
  } finally {
    server.disconnect();
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
