"""The local AWS engine: moto's server, with DynamoDB requests applied one at a time.

moto serves requests on parallel threads without a lock around the table, so two conditional
writes to one item can both pass their condition, where DynamoDB applies them atomically. One
lock around DynamoDB requests restores that guarantee; SQS requests (long polls among them)
keep running concurrently.

moto also snapshots every table a transaction touches (a deep copy of all its items) to roll
back a cancelled transaction, which makes each TransactWriteItems slower as tables grow. Here a
transaction snapshots only the items it touches and restores those.

moto's SQS computes every queue attribute, message counts included (each a walk over every message
in the queue), whenever code reads one, and SendMessage reads one per message: each send costs
time in proportion to the queue's length. Here the counts are computed only when they are read.
Its DeleteMessage walks the queue twice per receipt handle, building a list per message, and
replaces the message list without the lock SendMessage appends under (a message sent meanwhile
can be lost, and of two deletes at once one can be undone: that message comes back). Here one
walk under that lock deletes a whole batch. And ReceiveMessage reads the
clock twice per message in the queue to find the visible ones; here it reads it once per call.

Per request, moto's server also writes a log line and finds the service by listing its own
package directory and matching the URL patterns of every service: together about a fifth of the
engine's time under a worker fleet's load. Here requests are not logged (errors still are), and
the service of a host is found once. Its answers to DynamoDB's item operations are written by a
serializer that walks the output's model and looks up each attribute under several spellings:
another fifth, for items that are already in the wire's shape. Here those answers are written as
they are (LEASELOCK_ENGINE_CHECK=1 also runs moto's serializer on each and fails the request if
the two differ; the ItemAnswers test of `make test-engine` starts an engine that way).

The engine stands in for a remote service, whose capacity the processes under test do not share:
it raises its own scheduling priority (nice -5, LEASELOCK_ENGINE_NICE to change; left as it is
where that is not permitted), so a build running beside a test slows the workers, not the table.

Opt-in, DynamoDB's per-partition throughput limits (LEASELOCK_PARTITION_WCU /
LEASELOCK_PARTITION_RCU, units per second per partition key value): see scripts/partition_limits.py.

Opt-in, DynamoDB's index lag (LEASELOCK_ENGINE_INDEX_LAG_MS=N, or N,index-name=M,... per index; per
table at run time with POST /_leaselock/index-lag): a Query or Scan of a global secondary index
answers from the index as it was N ms ago, table reads at once; see scripts/index_lag.py. Lagged
or not, a consistent read of a global secondary index is refused, as DynamoDB refuses it (moto
does that itself).

    python scripts/local_engine.py [-H 127.0.0.1] [-p 4566]
"""

import argparse
import base64
import copy
import json
import logging
import os
import threading
from collections.abc import Mapping

import moto.dynamodb.models as dynamodb_models
from moto.dynamodb.models import DynamoDBBackend
from moto.core.responses import ActionResult
from moto.core.utils import unix_time_millis
from moto.dynamodb.models.table import Table
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from moto.server import MotoRequestHandler
from moto.sqs.exceptions import ReceiptHandleIsInvalid
from moto.sqs.models import Queue, SQSBackend
from werkzeug.serving import run_simple

import index_lag
import partition_limits


class _TablesAreNotCopied:
    """`copy` for moto's DynamoDB models, except that tables are not deep-copied."""

    def deepcopy(self, x, memo=None):
        return x if isinstance(x, Table) else copy.deepcopy(x, memo)

    def __getattr__(self, name):
        return getattr(copy, name)


def _item_key(table, op):
    if "Key" in op:
        return op["Key"]
    key = {table.hash_key_attr: op["Item"][table.hash_key_attr]}
    if table.range_key_attr is not None:
        key[table.range_key_attr] = op["Item"][table.range_key_attr]
    return key


_moto_transact = DynamoDBBackend.transact_write_items


def _transact_write_items(self, transact_items):
    before = []
    for entry in transact_items:
        _, op = next(iter(entry.items()))
        table = self.get_table(op["TableName"])
        key = _item_key(table, op)
        old = self.get_item(op["TableName"], key)
        before.append((op["TableName"], key, None if old is None else old.to_json()["Attributes"]))
    try:
        return _moto_transact(self, transact_items)
    except Exception:
        # Put back exactly what the transaction touched, in reverse order.
        for table_name, key, attributes in reversed(before):
            if attributes is None:
                self.delete_item(table_name, key)
            else:
                self.put_item(table_name, attributes)
        raise


_moto_backend_for_host = DomainDispatcherApplication.get_backend_for_host


def _backend_for_host(self, host):
    # Called under the dispatcher's lock; the answer depends on the host alone.
    cache = self.__dict__.setdefault("_backends_by_host", {})
    if host not in cache:
        cache[host] = _moto_backend_for_host(self, host)
    return cache[host]


DomainDispatcherApplication.get_backend_for_host = _backend_for_host

# DynamoDB operations whose answers hold only strings, numbers, lists, maps and items.
_ITEM_OPERATIONS = frozenset(
    "GetItem PutItem UpdateItem DeleteItem Query Scan BatchGetItem BatchWriteItem "
    "TransactGetItems TransactWriteItems".split()
)
_CHECK_ANSWERS = os.environ.get("LEASELOCK_ENGINE_CHECK") == "1"
_moto_execute_result = ActionResult.execute_result


class _NotPlain(Exception):
    pass


def _plain(value):
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode()
    raise _NotPlain


def _execute_result(self, context):
    result = self.result
    if (
        type(result) is not dict
        or context.operation_model.name not in _ITEM_OPERATIONS
        or context.service_model.service_name != "dynamodb"
    ):
        return _moto_execute_result(self, context)
    # moto's results can hold keys its serializer leaves out (not in the operation's output).
    members = context.operation_model.output_shape.members
    try:
        body = json.dumps({k: v for k, v in result.items() if k in members}, default=_plain)
    except _NotPlain:
        return _moto_execute_result(self, context)
    if _CHECK_ANSWERS:
        status, headers, moto_body = _moto_execute_result(self, context)
        if status != 200 or json.loads(moto_body) != json.loads(body):
            raise AssertionError(
                f"{context.operation_model.name}: moto answers {moto_body!r}, the engine {body!r}"
            )
    return 200, {"Content-Type": "application/x-amz-json-1.0"}, body


ActionResult.execute_result = _execute_result
dynamodb_models.copy = _TablesAreNotCopied()
DynamoDBBackend.transact_write_items = _transact_write_items

_MESSAGE_COUNTS = {
    "ApproximateNumberOfMessages": "approximate_number_of_messages",
    "ApproximateNumberOfMessagesDelayed": "approximate_number_of_messages_delayed",
    "ApproximateNumberOfMessagesNotVisible": "approximate_number_of_messages_not_visible",
}
_moto_queue_attributes = Queue.attributes.fget


class _CountsLeftOut:
    """A queue as moto's attribute code sees it, with every message count 0 (not walked)."""

    def __init__(self, queue):
        self._queue = queue

    def __getattr__(self, name):
        return 0 if name in _MESSAGE_COUNTS.values() else getattr(self._queue, name)


class _QueueAttributes(Mapping):
    """moto's attributes of a queue, with the message counts computed when they are read."""

    def __init__(self, queue):
        self._queue = queue
        self._static = _moto_queue_attributes(_CountsLeftOut(queue))

    def __getitem__(self, name):
        if name in _MESSAGE_COUNTS:
            return getattr(self._queue, _MESSAGE_COUNTS[name])
        return self._static[name]

    def __iter__(self):
        return iter(self._static)

    def __len__(self):
        return len(self._static)


Queue.attributes = property(_QueueAttributes)


def _delete_handles(queue, handles):
    """Deletes the messages that ever had one of `handles`; returns the handles that were known."""
    known = {h for h in handles if h in queue.deleted_messages}
    with queue._messages_lock:
        kept = []
        for message in queue._messages:
            mine = [h for h in (message.receipt_handle, *message._old_receipt_handles) if h in handles]
            if mine:
                known.update(mine)
                queue.pending_messages.discard(message)
                queue.deleted_messages.update(message.all_receipt_handles)
            else:
                kept.append(message)
        queue._messages = kept
    return known


def _queue_delete_message(self, receipt_handle):
    if receipt_handle not in _delete_handles(self, {receipt_handle}):
        raise ReceiptHandleIsInvalid()


def _delete_message_batch(self, queue_name, receipts):
    known = _delete_handles(self.get_queue(queue_name), {r["ReceiptHandle"] for r in receipts})
    success, errors = [], []
    for r in receipts:
        if r["ReceiptHandle"] in known:
            success.append(r["Id"])
        else:
            errors.append(
                {
                    "Id": r["Id"],
                    "SenderFault": True,
                    "Code": "ReceiptHandleIsInvalid",
                    "Message": f'The input receipt handle "{r["ReceiptHandle"]}" is not a valid receipt handle.',
                }
            )
    return success, errors


def _visible_messages(self):
    now = unix_time_millis()
    return [m for m in self._messages if now > m.visible_at and now >= m.delayed_until]


Queue.messages = property(_visible_messages)
Queue.delete_message = _queue_delete_message
SQSBackend.delete_message_batch = _delete_message_batch


class OneDynamoDBRequestAtATime:
    """Serialises DynamoDB requests; with `limits`, bills and limits them per partition too;
    with `lag` (an index_lag.IndexLag), lags GSI reads once some lag is set."""

    def __init__(self, app, limits=None, lag=None):
        self.app = app
        self.lock = threading.Lock()
        # Without limits, DynamoDB requests go straight to moto: nothing is parsed or counted.
        self.dynamodb = app if limits is None else partition_limits.PartitionLimited(app, limits)
        self.stats = None if limits is None else self.dynamodb.stats
        self.lag = index_lag.IndexLag() if lag is None else lag
        if self.lag.any():
            self.lag.install()
        self._clock_if_lagged()

    def _clock_if_lagged(self):
        # Until some lag is set, DynamoDB requests do not pass through the index lag at all.
        if self.lag.installed and not isinstance(self.dynamodb, index_lag.Clocked):
            self.dynamodb = index_lag.Clocked(self.dynamodb, self.lag)

    def __call__(self, environ, start_response):
        if not environ.get("HTTP_X_AMZ_TARGET", "").startswith("DynamoDB"):
            path = environ.get("PATH_INFO", "")
            if path.startswith("/_leaselock/"):
                if self.stats is not None and path.startswith(partition_limits.PATH):
                    with self.lock:
                        return self.stats(environ, start_response)
                if path.startswith(index_lag.PATH):
                    with self.lock:
                        answer = self.lag.control(environ, start_response)
                        self._clock_if_lagged()
                        return answer
            return self.app(environ, start_response)
        with self.lock:
            # The whole response is produced under the lock.
            return list(self.dynamodb(environ, start_response))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, default=4566)
    args = parser.parse_args()
    # Before any thread starts: threads inherit it.
    try:
        os.setpriority(os.PRIO_PROCESS, 0, int(os.environ.get("LEASELOCK_ENGINE_NICE", "-5")))
    except (OSError, ValueError):
        pass
    limits = partition_limits.limits_from_env()
    if limits is not None:
        print(
            "local engine: per-partition limits, write units/s %s, read units/s %s (%s)"
            % (limits[0] or "unlimited", limits[1] or "unlimited", partition_limits.PATH),
            flush=True,
        )
        limits = partition_limits.PartitionLimits(*limits)
    lag = index_lag.IndexLag(*index_lag.settings_from_env())
    if lag.any():
        print(
            "local engine: GSI reads lag %d ms%s (%s)"
            % (lag.default_ms, "".join(f", {k} {v} ms" for k, v in lag.indexes.items()), index_lag.PATH),
            flush=True,
        )
    # werkzeug logs each request at INFO, and errors at ERROR.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(
        args.host,
        args.port,
        OneDynamoDBRequestAtATime(app, limits, lag),
        threaded=True,
        request_handler=MotoRequestHandler,
    )


if __name__ == "__main__":
    main()
