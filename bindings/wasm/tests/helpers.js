'use strict';
// Shared setup of the Node tests: SDK clients on the local engine (scripts/with-services.sh sets
// AWS_ENDPOINT_URL), tables with unique names, and direct item reads and writes.
const { DynamoDBClient, GetItemCommand, PutItemCommand } = require('@aws-sdk/client-dynamodb');
const { LeaseTable } = require('..');

let tables = 0;

function client(options = {}) {
  if (!process.env.AWS_ENDPOINT_URL) {
    throw new Error('AWS_ENDPOINT_URL is not set: run through scripts/with-services.sh');
  }
  return new DynamoDBClient({ maxAttempts: 3, ...options });
}

/** A new table with a unique name, created through leaselock. */
async function freshTable(options = {}, sdk = client()) {
  tables += 1;
  const tableName = `node-${process.pid}-${Date.now().toString(36)}-${tables}`;
  const table = new LeaseTable({ client: sdk, tableName, ...options });
  await table.createTable();
  // Its first claim would describe it first: done here, so a test counts only its own requests.
  await table.checkTable();
  return table;
}

/** The raw item of `id`, read with the SDK directly (strongly consistent). */
async function rawItem(table, id) {
  const out = await table.client.send(
    new GetItemCommand({ TableName: table.tableName, Key: { connection_id: { S: id } }, ConsistentRead: true }),
  );
  return out.Item;
}

/** Rewrites an item directly with the SDK, behind leaselock's back. */
async function putRaw(table, item) {
  await table.client.send(new PutItemCommand({ TableName: table.tableName, Item: item }));
}

/** Polls `check` until it returns a truthy value, failing after `ms`. */
async function eventually(check, ms, what) {
  const until = Date.now() + ms;
  for (;;) {
    const value = await check();
    if (value) {
      return value;
    }
    if (Date.now() > until) {
      throw new Error(`not within ${ms} ms: ${what}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
}

module.exports = { client, freshTable, rawItem, putRaw, eventually };
