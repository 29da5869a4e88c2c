"""The local AWS engine: moto's server, with DynamoDB requests applied one at a time.

moto serves requests on parallel threads without a lock around the table, so two conditional
writes to one item can both pass their condition, where DynamoDB applies them atomically. One
lock around DynamoDB requests restores that guarantee; SQS requests (long polls among them)
keep running concurrently.

moto also snapshots every table a transaction touches (a deep copy of all its items) to roll
back a cancelled transaction, which makes each TransactWriteItems slower as tables grow. Here a
transaction snapshots only the items it touches and restores those.

    python scripts/local_engine.py [-H 127.0.0.1] [-p 4566]
"""

import argparse
import copy
import threading

import moto.dynamodb.models as dynamodb_models
from moto.dynamodb.models import DynamoDBBackend
from moto.dynamodb.models.table import Table
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from moto.server import MotoRequestHandler
from werkzeug.serving import run_simple


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


dynamodb_models.copy = _TablesAreNotCopied()
DynamoDBBackend.transact_write_items = _transact_write_items


class OneDynamoDBRequestAtATime:
    def __init__(self, app):
        self.app = app
        self.lock = threading.Lock()

    def __call__(self, environ, start_response):
        if not environ.get("HTTP_X_AMZ_TARGET", "").startswith("DynamoDB"):
            return self.app(environ, start_response)
        with self.lock:
            # The whole response is produced under the lock.
            return list(self.app(environ, start_response))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, default=4566)
    args = parser.parse_args()
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(
        args.host,
        args.port,
        OneDynamoDBRequestAtATime(app),
        threaded=True,
        request_handler=MotoRequestHandler,
    )


if __name__ == "__main__":
    main()
