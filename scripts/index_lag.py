"""Global secondary indexes that lag, for the local engine (scripts/local_engine.py), opt-in.

DynamoDB updates a global secondary index after the table write, usually within a second and
later under write pressure, and reads it only eventually consistently (a Query or Scan with
`ConsistentRead: true` on a GSI is refused; moto refuses it too). moto answers a GSI read from
the table's current items. With

    LEASELOCK_ENGINE_INDEX_LAG_MS=N                 every GSI read answers from the index as it was N ms ago
    LEASELOCK_ENGINE_INDEX_LAG_MS=N,name=M,...      ... and M ms for the GSIs named `name` (of any table)

(`name=M` entries alone leave the other indexes at 0) a Query or Scan with an `IndexName` of a
GSI answers from the table as it was that long ago: an item written since is not listed yet, an
item changed since is listed under its old index key with its old attributes, an item deleted
since (or that left a sparse index) is still listed. Key conditions, filters, projections, Limit,
pagination and Select COUNT work as moto's. Base-table reads (GetItem, BatchGetItem,
TransactGetItems, Query and Scan without an index, local secondary indexes) are not lagged, nor
are PartiQL reads. With the partition limits on too, a lagged read is billed by the items as
they are now.

At run time, per table (the tables of a test on a shared engine, say):

    POST /_leaselock/index-lag  {"table": "t", "ms": 800}                    every GSI of table t
    POST /_leaselock/index-lag  {"table": "t", "index": "by-owner", "ms": 0}  one GSI of table t
    GET  /_leaselock/index-lag

A table's setting overrides the environment's for that table, an index's the table's; `"ms":
null` removes a setting. Both answer 200 with every setting: `{"default_ms": N, "indexes":
{name: ms}, "tables": {table: {"ms": ms or null, "indexes": {name: ms}}}}`.

How: every DynamoDB request runs alone under the engine's lock. For each table with a lagged
GSI, each item write (PutItem, UpdateItem, DeleteItem, their parts in BatchWriteItem and
TransactWriteItems, PartiQL) records the time and the item as it was before, kept as long as
the table's largest lag. A lagged GSI read puts the table's items as they were then (the current
ones, with the writes since undone) in place of moto's for that one call and moto answers from
them; moto keeps no index structure of its own (it walks the table's items on every GSI read).
A lag raised at run time reaches back only to the writes made since the table was lagged.

Until some lag is set, nothing of this runs: no write is recorded, no read looks at a setting.
"""

from __future__ import annotations

import copy
import json
import os
import time
from collections import defaultdict, deque

from moto.dynamodb.exceptions import ResourceNotFoundException
from moto.dynamodb.models import DynamoDBBackend
from moto.dynamodb.models.dynamo_type import DynamoType
from moto.dynamodb.models.table import Table

PATH = "/_leaselock/index-lag"
ENV = "LEASELOCK_ENGINE_INDEX_LAG_MS"
# (monotonic time of the write, (hash key, range key or None), the item before it or None), oldest first.
_HISTORY = "_leaselock_index_history"


def _ms(value, what):
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} must be a whole number of milliseconds >= 0, not {value!r}")
    return value


def settings_from_env(environ=os.environ):
    """(default ms, {index name: ms}) from LEASELOCK_ENGINE_INDEX_LAG_MS."""
    raw = environ.get(ENV, "").strip()
    default, indexes = 0, {}
    for entry in filter(None, (e.strip() for e in raw.split(","))):
        name, _, value = entry.rpartition("=")
        try:
            ms = _ms(int(value.strip()), ENV)
        except ValueError:
            raise SystemExit(f"{ENV}: {entry!r} is not N or index-name=N (milliseconds)")
        if name.strip():
            indexes[name.strip()] = ms
        else:
            default = ms
    return default, indexes


class IndexLag:
    """The lag settings, the tables' recent writes and the lagged reads."""

    def __init__(self, default_ms=0, indexes=None, clock=time.monotonic):
        self.default_ms = default_ms
        self.indexes = dict(indexes or {})
        self.tables = {}
        self.clock = clock
        # The time of the DynamoDB request being served (one time for all its writes).
        self.now = None
        self.installed = False

    def any(self):
        return bool(
            self.default_ms
            or any(self.indexes.values())
            or any(t["ms"] or any(t["indexes"].values()) for t in self.tables.values())
        )

    def lag_ms(self, table, index):
        setting = self.tables.get(table)
        if setting is not None:
            if index in setting["indexes"]:
                return setting["indexes"][index]
            if setting["ms"] is not None:
                return setting["ms"]
        return self.indexes.get(index, self.default_ms)

    def set(self, table, ms, index=None):
        setting = self.tables.setdefault(table, {"ms": None, "indexes": {}})
        if index is None:
            setting["ms"] = ms
        elif ms is None:
            setting["indexes"].pop(index, None)
        else:
            setting["indexes"][index] = ms
        if setting["ms"] is None and not setting["indexes"]:
            del self.tables[table]

    def report(self):
        return {"default_ms": self.default_ms, "indexes": self.indexes, "tables": self.tables}

    # The request path, once some lag is set.

    def _time(self):
        return self.now if self.now is not None else self.clock()

    def _keep_ms(self, table):
        return max((self.lag_ms(table.name, i.name) for i in table.global_indexes or ()), default=0)

    def record(self, table, key, before):
        keep = self._keep_ms(table)
        history = table.__dict__.get(_HISTORY)
        if keep <= 0:
            if history:
                history.clear()
            return
        if history is None:
            history = table.__dict__[_HISTORY] = deque()
        now = self._time()
        history.append((now, key, before))
        _prune(history, now - keep / 1000)

    def past_items(self, table, index_name):
        """moto's item map of `table` as the index `index_name` shows it, or None for the current one."""
        history = table.__dict__.get(_HISTORY)
        if not history or not any(i.name == index_name for i in table.global_indexes or ()):
            return None
        lag = self.lag_ms(table.name, index_name)
        if lag <= 0:
            return None
        now = self._time()
        _prune(history, now - self._keep_ms(table) / 1000)
        since = now - lag / 1000
        before = {}
        for at, key, item in reversed(history):
            if at <= since:
                break
            before[key] = item  # the earliest write since wins
        if not before:
            return None
        items = defaultdict(dict, table.items)
        if table.range_key_attr is None:
            for (hash_key, _), item in before.items():
                if item is None:
                    items.pop(hash_key, None)
                else:
                    items[hash_key] = item
            return items
        for hash_key in {h for h, _ in before}:
            items[hash_key] = dict(items.get(hash_key, ()))
        for (hash_key, range_key), item in before.items():
            if item is None:
                items[hash_key].pop(range_key, None)
            else:
                items[hash_key][range_key] = item
        for hash_key in {h for h, _ in before}:
            if not items[hash_key]:
                del items[hash_key]
        return items

    def install(self):
        """Records writes and lags GSI reads from now on (for tables and indexes with a lag)."""
        if not self.installed:
            _install(self)
            self.installed = True

    # The HTTP control.

    def control(self, environ, start_response):
        status = "200 OK"
        if environ.get("REQUEST_METHOD") == "POST":
            try:
                raw = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
                body = json.loads(raw or b"{}")
                table, index, ms = body.get("table"), body.get("index"), body.get("ms")
                if not isinstance(table, str) or not table:
                    raise ValueError('"table" must name a table')
                if index is not None and (not isinstance(index, str) or not index):
                    raise ValueError('"index" must name an index')
                if "ms" not in body:
                    raise ValueError('"ms" must be given (null to remove the setting)')
                if ms is not None:
                    _ms(ms, '"ms"')
                self.set(table, ms, index)
                if self.any():
                    self.install()
            except (ValueError, AttributeError) as e:
                status, answer = "400 Bad Request", {"message": str(e)}
        if status.startswith("200"):
            answer = self.report()
        out = json.dumps(answer).encode()
        start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(out)))])
        return [out]


def _prune(history, older_than):
    while history and history[0][0] <= older_than:
        history.popleft()


class Clocked:
    """WSGI layer inside the engine's lock: one time for each DynamoDB request."""

    def __init__(self, app, lag):
        self.app, self.lag = app, lag

    def __call__(self, environ, start_response):
        self.lag.now = self.lag.clock()
        try:
            return list(self.app(environ, start_response))
        finally:
            self.lag.now = None


def _current(table, hash_key, range_key):
    if range_key is None:
        return table.items.get(hash_key)
    return table.items.get(hash_key, {}).get(range_key)


def _install(lag):
    moto_put = Table.put_item
    moto_delete = Table.delete_item
    moto_update = DynamoDBBackend.update_item
    moto_query = DynamoDBBackend.query
    moto_scan = DynamoDBBackend.scan

    def put_item(self, item_attrs, *args, **kwargs):
        if not self.global_indexes:
            return moto_put(self, item_attrs, *args, **kwargs)
        try:
            key = (
                DynamoType(item_attrs[self.hash_key_attr]),
                None if self.range_key_attr is None else DynamoType(item_attrs[self.range_key_attr]),
            )
            before = _current(self, *key)
        except (KeyError, TypeError, IndexError):
            return moto_put(self, item_attrs, *args, **kwargs)  # moto refuses it
        item = moto_put(self, item_attrs, *args, **kwargs)
        lag.record(self, key, before)
        return item

    def delete_item(self, hash_key, range_key):
        item = moto_delete(self, hash_key, range_key)
        if item is not None and self.global_indexes:
            lag.record(self, (hash_key, range_key if self.range_key_attr else None), item)
        return item

    def update_item(self, table_name, key, *args, **kwargs):
        # moto changes the item in place: the item before is a copy.
        try:
            table = self.get_table(table_name)
            hashed = (
                DynamoType(key[table.hash_key_attr]),
                None if table.range_key_attr is None else DynamoType(key[table.range_key_attr]),
            )
        except Exception:
            return moto_update(self, table_name, key, *args, **kwargs)  # moto refuses it
        if not table.global_indexes:
            return moto_update(self, table_name, key, *args, **kwargs)
        before = copy.deepcopy(_current(table, *hashed))
        item = moto_update(self, table_name, key, *args, **kwargs)
        lag.record(table, hashed, before)
        return item

    def lagged(moto_read):
        def read(self, table_name, *args, index_name=None, **kwargs):
            past = None
            if index_name:
                try:
                    table = self.get_table(table_name)
                except ResourceNotFoundException:
                    table = None  # moto answers that
                past = None if table is None else lag.past_items(table, index_name)
            if past is None:
                return moto_read(self, table_name, *args, index_name=index_name, **kwargs)
            current, table.items = table.items, past
            try:
                return moto_read(self, table_name, *args, index_name=index_name, **kwargs)
            finally:
                table.items = current

        return read

    Table.put_item = put_item
    Table.delete_item = delete_item
    DynamoDBBackend.update_item = update_item
    DynamoDBBackend.query = lagged(moto_query)
    DynamoDBBackend.scan = lagged(moto_scan)
