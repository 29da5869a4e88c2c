'use strict';
// The only I/O of a lease operation: one request sent with the caller's DynamoDBClient, and
// what came back, described for the protocol (which decides what it means).

const { performance } = require('node:perf_hooks');
const ddb = require('@aws-sdk/client-dynamodb');

/** The SDK command of each request the protocol sends (its input is the request's JSON). */
const COMMANDS = {
  GetItem: ddb.GetItemCommand,
  UpdateItem: ddb.UpdateItemCommand,
  Query: ddb.QueryCommand,
  Scan: ddb.ScanCommand,
  BatchGetItem: ddb.BatchGetItemCommand,
  TransactWriteItems: ddb.TransactWriteItemsCommand,
  CreateTable: ddb.CreateTableCommand,
  UpdateTable: ddb.UpdateTableCommand,
  DescribeTable: ddb.DescribeTableCommand,
  DescribeTimeToLive: ddb.DescribeTimeToLiveCommand,
  UpdateTimeToLive: ddb.UpdateTimeToLiveCommand,
};

const ATTEMPT = 'LeaseLockAttempt';

/**
 * The protocol retries by itself, so the client's retry strategy must not: a blind retry of a
 * claim that was applied would read as held, of a checkpoint as not increasing. This sits just
 * inside the client's retry middleware and hands every failure of the one attempt outward in a
 * wrapper no retry strategy retries (no status, no code, no `cause`).
 */
function singleAttempt(next) {
  return async (args) => {
    try {
      return await next(args);
    } catch (error) {
      throw oneAttempt(error);
    }
  };
}

function oneAttempt(error) {
  const wrapped = new Error('leaselock: one attempt');
  wrapped.name = ATTEMPT;
  wrapped.attemptError = error;
  return wrapped;
}

/**
 * `singleAttempt` that also hands the answer's headers (its `date` and `age` measure the
 * store's clock), with the local clocks when the request went out, to `observe(sentWall,
 * sentMono, headers)` when `wantsSample(sentMono)`: a refusal measures as well as a success.
 */
function measuredAttempt(observe, wantsSample) {
  return (next) => async (args) => {
    const sentMono = performance.now();
    if (!wantsSample(sentMono)) {
      return singleAttempt(next)(args);
    }
    const sentWall = Date.now();
    try {
      const out = await next(args);
      observe(sentWall, sentMono, out.response?.headers);
      return out;
    } catch (error) {
      observe(sentWall, sentMono, error?.$response?.headers);
      throw oneAttempt(error);
    }
  };
}
const SINGLE_ATTEMPT = {
  name: 'leaselockSingleAttempt',
  relation: 'after',
  toMiddleware: 'retryMiddleware',
  override: true,
};

/**
 * An SDK answer as JSON text: binary values (Uint8Array, which would print as `{"0":..}`) as
 * base64, as in the DynamoDB JSON API. The replacer costs a call per value, so it is only used
 * when a `B` or `BS` value is there (an attribute merely named `B` just takes the slow path).
 */
function outputJson(output) {
  const text = JSON.stringify(output);
  return BINARY.test(text) ? JSON.stringify(output, binaryAsBase64) : text;
}
const BINARY = /"BS?":\[?\{/;

function binaryAsBase64(_key, value) {
  return value instanceof Uint8Array ? Buffer.from(value).toString('base64') : value;
}

/**
 * One attempt's abort signal: the face of an AbortSignal the SDK reads (`aborted`, `reason`,
 * abort listeners), without an AbortController and EventTarget per request, which cost more
 * CPU than the rest of a renewal's JavaScript.
 */
class AttemptSignal {
  aborted = false;
  reason = undefined;
  onabort = null;
  #listeners = [];

  addEventListener(type, listener) {
    if (type === 'abort') {
      this.#listeners.push(listener);
    }
  }

  removeEventListener(type, listener) {
    const i = this.#listeners.indexOf(listener);
    if (i >= 0) {
      this.#listeners.splice(i, 1);
    }
  }

  abort(reason) {
    if (this.aborted) {
      return;
    }
    this.aborted = true;
    this.reason = reason;
    for (const listener of this.#listeners.splice(0)) {
      listener.call(this, { type: 'abort' });
    }
    this.onabort?.({ type: 'abort' });
  }
}

/**
 * Sends one request. Resolves `{ output }` (JSON text) or `{ failure }` (what the failure was:
 * name, message, HTTP status, Node error code, the old item of a failed condition, a cancelled
 * transaction's reasons, whether the attempt ran out of time). Rejects only with the caller's
 * abort reason. `oneAttemptOf`: the single-attempt middleware (`measuredAttempt` of the table's
 * clock).
 */
async function send(client, operation, input, timeoutMs, signal, appendItems, oneAttemptOf = singleAttempt) {
  const Command = COMMANDS[operation];
  if (appendItems !== undefined) {
    input.TransactItems.push(...appendItems);
  }
  const command = new Command(input);
  command.middlewareStack.addRelativeTo(oneAttemptOf, SINGLE_ATTEMPT);
  const attempt = new AttemptSignal();
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    attempt.abort(new Error(`no answer within ${timeoutMs} ms`));
  }, timeoutMs);
  const onAbort = () => attempt.abort(signal.reason);
  signal?.addEventListener('abort', onAbort, { once: true });
  try {
    const output = await client.send(command, { abortSignal: attempt });
    return { output: outputJson(output), raw: output };
  } catch (thrown) {
    if (signal?.aborted) {
      throw signal.reason;
    }
    const error = thrown?.name === ATTEMPT ? thrown.attemptError : thrown;
    return { failure: JSON.stringify(describe(error, timedOut), binaryAsBase64), error };
  } finally {
    clearTimeout(timer);
    signal?.removeEventListener('abort', onAbort);
  }
}

/** The facts of a failed request the protocol classifies (see `answerForFailure` in Rust). */
function describe(error, timedOut) {
  return {
    name: String(error?.name ?? 'Error'),
    message: String(error?.message ?? error),
    status: error?.$metadata?.httpStatusCode ?? null,
    code: typeof error?.code === 'string' ? error.code : null,
    item: error?.Item ?? null,
    reasons: error?.CancellationReasons ?? null,
    timedOut,
  };
}

module.exports = { send, outputJson, measuredAttempt, COMMANDS };
