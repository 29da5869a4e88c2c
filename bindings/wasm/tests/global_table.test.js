'use strict';
// Global tables through the driver, with recorded answers (the local engine cannot make a
// global table): a table in multi-Region eventual consistency is refused before any claim (by
// acquire, using, the worker and the elector), a strongly consistent one is described once per
// LeaseTable and its ReplicatedWriteConflictException is retried, and the opt-in sends nothing.
const test = require('node:test');
const assert = require('node:assert/strict');
const { LeaseTable, LeaderElector, Worker, InvalidInputError } = require('..');

const REPLICAS = [
  { RegionName: 'us-east-1', ReplicaStatus: 'ACTIVE' },
  { RegionName: 'eu-west-1', ReplicaStatus: 'ACTIVE' },
];

const REFUSED =
  'invalid table: leases is a global table in multi-Region eventual consistency (replicas: us-east-1, eu-west-1), ' +
  'where concurrent writes in two Regions resolve last-writer-wins, so a lease on it is not exclusive across ' +
  'Regions; use a single-Region table or a multi-Region strong consistency (MRSC) global table, or, if every ' +
  'writer of this table writes in one Region, opt in with allow_eventual_global_table ' +
  '(LEASELOCK_ALLOW_EVENTUAL_GLOBAL_TABLE=1)';

/** A DynamoDBClient stand-in answering `answer(operation, nth)`; `sent` lists the operations. */
function recordedClient(answer) {
  const sent = [];
  return {
    sent,
    async send(command) {
      const operation = command.constructor.name.replace(/Command$/, '');
      const nth = sent.filter((o) => o === operation).length;
      sent.push(operation);
      return answer(operation, nth);
    },
  };
}

function globalTable(consistency) {
  const Table = { TableName: 'leases', TableStatus: 'ACTIVE', Replicas: REPLICAS };
  if (consistency !== undefined) {
    Table.MultiRegionConsistency = consistency;
  }
  return { Table, $metadata: { httpStatusCode: 200 } };
}

function onlyDescribed(consistency) {
  return recordedClient((operation) => {
    assert.equal(operation, 'DescribeTable', `nothing but DescribeTable may be sent, got ${operation}`);
    return globalTable(consistency);
  });
}

const refused = (e) => e instanceof InvalidInputError && e.field === 'table' && e.message === REFUSED;

for (const consistency of ['EVENTUAL', undefined]) {
  test(`a global table in eventual consistency (${consistency ?? 'field absent'}) is refused before any claim`, async () => {
    const client = onlyDescribed(consistency);
    const table = new LeaseTable({ client, tableName: 'leases' });
    await assert.rejects(table.checkTable(), refused);
    await assert.rejects(table.acquire('s1', { owner: 'a' }), refused);
    await assert.rejects(
      table.using('s1', { owner: 'a' }, async () => assert.fail('not run')),
      refused,
    );
    const worker = new Worker({ table, handler: async () => assert.fail('nothing is claimed'), metrics: () => {} });
    await assert.rejects(worker.run(), refused);
    const elector = new LeaderElector({ table, owner: 'a' });
    await assert.rejects(
      elector.runIfLeader('nightly', async () => assert.fail('not elected')),
      refused,
    );
    assert.ok(client.sent.length >= 1 && client.sent.every((o) => o === 'DescribeTable'), `${client.sent}`);
  });
}

test('a strongly consistent global table is described once; its write conflicts are retried', async () => {
  const conflict = () =>
    Object.assign(
      new Error(
        'The request was rejected because one or more items in the request are being modified by a request in another Region.',
      ),
      { name: 'ReplicatedWriteConflictException', $fault: 'client', $metadata: { httpStatusCode: 400 } },
    );
  const client = recordedClient((operation, nth) => {
    if (operation === 'DescribeTable') {
      return globalTable('STRONG');
    }
    assert.equal(operation, 'UpdateItem');
    if (nth < 2) {
      throw conflict();
    }
    return {
      Attributes: {
        connection_id: { S: 's1' },
        lease_owner: { S: 'a' },
        fence: { N: '1' },
        lease_expires_at_ms: { N: String(Date.now() + 20_000) },
      },
    };
  });
  const table = new LeaseTable({ client, tableName: 'leases' });
  assert.deepEqual(await table.checkTable(), { kind: 'strong', regions: ['us-east-1', 'eu-west-1'] });
  const lease = await table.acquire('s1', { owner: 'a' });
  assert.deepEqual([lease.owner, lease.fence], ['a', 1]);
  assert.deepEqual(client.sent, ['DescribeTable', 'UpdateItem', 'UpdateItem', 'UpdateItem']);
});

test('the opt-in sends nothing; bad values of it are refused naming the option', async () => {
  const client = recordedClient((operation) => assert.fail(`nothing may be sent, got ${operation}`));
  const table = new LeaseTable({ client, tableName: 'leases', allowEventualGlobalTable: true });
  assert.equal(table.allowEventualGlobalTable, true);
  assert.deepEqual(await table.checkTable(), { kind: 'not-checked' });
  assert.throws(
    () => new LeaseTable({ client, tableName: 'leases', allowEventualGlobalTable: 'yes' }),
    (e) => e instanceof InvalidInputError && e.field === 'allowEventualGlobalTable',
  );
});

test('arguments are checked before the table', async () => {
  const client = recordedClient((operation) => assert.fail(`nothing may be sent, got ${operation}`));
  const table = new LeaseTable({ client, tableName: 'leases' });
  await assert.rejects(table.acquire('', { owner: 'a' }), (e) => e instanceof InvalidInputError && e.field === 'id');
  assert.deepEqual(client.sent, []);
});
