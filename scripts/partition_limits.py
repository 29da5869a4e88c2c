"""Per-partition throughput limits for the local engine (scripts/local_engine.py), opt-in.

DynamoDB serves about 1,000 write units and 3,000 read units per second per partition key value,
for a table's items and for each global secondary index's partition values alike, and answers
ProvisionedThroughputExceededException past that (a hot partition), on-demand tables included.
moto has no such limit. With

    LEASELOCK_PARTITION_WCU=N   write units per second per partition key value
    LEASELOCK_PARTITION_RCU=N   read units per second per partition key value

(either or both; a limit left unset is not enforced, but its units are still counted) every
DynamoDB request is billed as DynamoDB bills it and refused past the rate, so a scaled-down
limit (50 instead of 1,000) shows on this machine the throttling that 20x the traffic would show
in AWS. Without either variable the engine does none of this (the request path is unchanged).

Billing, per partition key value (of the table, and of each GSI):
- a write: 1 unit per KB (rounded up) of the larger of the item before and after, at least 1;
  2x inside TransactWriteItems (a ConditionCheck is billed as such a write). A conditional
  write whose condition fails is billed on the table as well (the item as it was), never on an
  index.
- the index part of a write, for each GSI: an item entering the index is one index write (its
  projected size, per KB) on its index partition, an item leaving it one on the old partition,
  a change of the index key a delete on the old partition plus an insert on the new one (2
  writes: a renewal that moves `lease_expires_at_ms` costs 2 index units on `STARTED`), a change
  of a projected attribute alone 1 write; nothing if no projected attribute changed.
- a read: 4 KB per unit (rounded up), halved if eventually consistent (index queries always
  are); GetItem and each key of BatchGetItem per item (a missing item costs the minimum), Query
  the sum of the items returned, rounded up once, at least the minimum; 2x in TransactGetItems.
  Scan is not billed to a partition (it reads them all). Item sizes are DynamoDB's: attribute
  names plus values.

A request is refused when, with its units, any partition it touches would have consumed more
than its limit in the last second (a sliding one-second window; DynamoDB's burst capacity is
not modelled). A refused request changes nothing and consumes nothing: a write applied by moto
is put back. The answer is HTTP 400 with DynamoDB's JSON error shape
(`ProvisionedThroughputExceededException` with `ThrottlingReasons`, e.g.
`IndexWriteKeyRangeThroughputExceeded` and the index's ARN, when the index partition cannot
absorb a table write); a throttled item of TransactWriteItems cancels the transaction with the
`ThrottlingError` cancellation reason, as DynamoDB does. BatchGetItem and BatchWriteItem are
refused whole (DynamoDB would return the throttled part as unprocessed).

`GET /_leaselock/partitions` answers what was counted since the start or the last
`POST /_leaselock/partitions/reset`: the limits, per partition (table or index, partition value,
read or write) the units, the peak units in any one-second window and the throttled requests,
and per table the item writes applied by each operation.
"""

from __future__ import annotations

import base64
import io
import json
import math
import os
import re
import time
import zlib
from collections import defaultdict, deque
from decimal import Decimal

from moto.dynamodb.models import dynamodb_backends
from moto.dynamodb.models.dynamo_type import DynamoType

PATH = "/_leaselock/partitions"
ERROR_PREFIX = "com.amazonaws.dynamodb.v20120810#"
WRITE_OPS = {"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems"}
READ_OPS = {"GetItem", "BatchGetItem", "Query", "TransactGetItems"}
_REGION = re.compile(r"Credential=[^/]+/[^/]+/([^/]+)/")


def limits_from_env(environ=os.environ):
    """(write units/s, read units/s) per partition from the environment, or None when neither is set."""

    def limit(name):
        raw = environ.get(name, "").strip()
        if not raw:
            return None
        value = float(raw)
        if not value > 0:
            raise SystemExit(f"{name} must be a positive number of units per second, not {raw!r}")
        return value

    wcu, rcu = limit("LEASELOCK_PARTITION_WCU"), limit("LEASELOCK_PARTITION_RCU")
    return None if wcu is None and rcu is None else (wcu, rcu)


# Item sizes, as DynamoDB counts them.


def _number_size(text):
    digits = text.lstrip("-").replace(".", "")
    if "e" in digits.lower():
        digits = format(Decimal(text), "f").lstrip("-").replace(".", "")
    digits = digits.strip("0") or "0"
    return (len(digits) + 1) // 2 + 1


def value_size(value):
    (kind, v), = value.items()
    if kind == "S":
        return len(v.encode())
    if kind == "N":
        return _number_size(v)
    if kind == "B":
        return len(base64.b64decode(v)) if isinstance(v, str) else len(v)
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "SS":
        return sum(len(s.encode()) for s in v)
    if kind == "NS":
        return sum(_number_size(s) for s in v)
    if kind == "BS":
        return sum(len(base64.b64decode(b)) if isinstance(b, str) else len(b) for b in v)
    if kind == "L":
        return 3 + sum(1 + value_size(e) for e in v)
    if kind == "M":
        return 3 + sum(1 + len(k.encode()) + value_size(e) for k, e in v.items())
    return 0


def item_size(attrs):
    return sum(len(name.encode()) + value_size(value) for name, value in attrs.items()) if attrs else 0


def write_units(size):
    return max(1, math.ceil(size / 1024))


def read_units(size, consistent):
    units = max(1, math.ceil(size / 4096))
    return units if consistent else units / 2


# Where an item sits.


class TableView:
    """What the billing needs of one moto table: its keys, its GSIs, items by key."""

    def __init__(self, backend, table):
        self.backend, self.table, self.name = backend, table, table.name
        self.keys = [table.hash_key_attr] + ([table.range_key_attr] if table.range_key_attr else [])
        self.indexes = []
        for index in getattr(table, "global_indexes", None) or []:
            key_attrs = [k["AttributeName"] for k in index.schema]
            projection = index.projection or {}
            self.indexes.append(
                (
                    index.name,
                    key_attrs,
                    projection.get("ProjectionType", "ALL"),
                    set(self.keys + key_attrs + list(projection.get("NonKeyAttributes", []))),
                )
            )

    def arn(self, index=None):
        return self.table.table_arn + (f"/index/{index}" if index else "")

    def key_of(self, attrs):
        return {k: attrs[k] for k in self.keys if k in attrs}

    def get(self, key):
        hash_key = DynamoType(key[self.keys[0]]) if self.keys[0] in key else None
        range_key = DynamoType(key[self.keys[1]]) if len(self.keys) > 1 and self.keys[1] in key else None
        if hash_key is None:
            return None
        try:
            item = self.table.get_item(hash_key, range_key)
        except Exception:
            return None
        return None if item is None else item.to_json()["Attributes"]

    def put_back(self, key, attrs):
        if attrs is None:
            if self.get(key) is not None:
                self.backend.delete_item(self.name, key)
        else:
            self.backend.put_item(self.name, attrs)

    def partition(self, attrs):
        return _scalar(attrs[self.keys[0]])

    def index_entry(self, index, attrs):
        """(partition value, index key, projected attributes) of `attrs` in `index`, or None."""
        _, key_attrs, projection, projected = index
        if attrs is None or any(k not in attrs for k in key_attrs):
            return None
        key = tuple(_scalar(attrs[k]) for k in key_attrs)
        shown = attrs if projection == "ALL" else {k: v for k, v in attrs.items() if k in projected}
        return key[0], key, shown


def _scalar(value):
    (_, v), = value.items()
    return v if isinstance(v, str) else json.dumps(v, sort_keys=True)


class Charges:
    """Units one request consumes, by (kind, table, index or None, partition value)."""

    def __init__(self):
        self.units = defaultdict(float)
        self.arns = {}
        self.item_of = {}

    def add(self, kind, view, index, partition, units, item=None):
        key = (kind, view.name, index, partition)
        self.units[key] += units
        self.arns[key] = view.arn(index)
        if item is not None:
            self.item_of.setdefault(key, item)


def bill_write(charges, view, old, new, factor=1, item=None):
    """A write that turned `old` into `new` (attributes, None for no item)."""
    shown = new if new is not None else old
    if shown is None:
        return
    charges.add("write", view, None, view.partition(shown), factor * write_units(max(item_size(old), item_size(new))), item)
    for index in view.indexes:
        before, after = view.index_entry(index, old), view.index_entry(index, new)
        if before == after:
            continue
        if before is not None and after is not None and before[1] == after[1]:
            charges.add("write", view, index[0], after[0], write_units(max(item_size(before[2]), item_size(after[2]))), item)
            continue
        if before is not None:
            charges.add("write", view, index[0], before[0], write_units(item_size(before[2])), item)
        if after is not None:
            charges.add("write", view, index[0], after[0], write_units(item_size(after[2])), item)


class Window:
    """Units consumed by one partition in the last second, and what was counted since the reset."""

    __slots__ = ("events", "total", "in_window", "peak", "throttled")

    def __init__(self):
        self.events = deque()
        self.total = 0.0
        self.in_window = 0.0
        self.peak = 0.0
        self.throttled = 0

    def used(self, now):
        while self.events and self.events[0][0] <= now - 1.0:
            self.in_window -= self.events.popleft()[1]
        return self.in_window

    def consume(self, now, units):
        self.events.append((now, units))
        self.in_window += units
        self.total += units
        self.peak = max(self.peak, self.in_window)


class PartitionLimits:
    def __init__(self, wcu, rcu, clock=time.monotonic):
        self.limit = {"write": wcu, "read": rcu}
        self.clock = clock
        self.reset()

    def reset(self):
        self.windows = defaultdict(Window)
        self.writes = defaultdict(lambda: defaultdict(int))
        self.throttled_requests = 0

    def admit(self, charges):
        """Consumes the charges and returns None, or returns the partitions over their limit."""
        now = self.clock()
        over = []
        for key, units in charges.units.items():
            limit = self.limit[key[0]]
            if limit is not None and self.windows[key].used(now) + units > limit + 1e-9:
                over.append(key)
        if over:
            self.throttled_requests += 1
            for key in over:
                self.windows[key].throttled += 1
            return over
        for key, units in charges.units.items():
            self.windows[key].consume(now, units)
        return None

    def report(self):
        now = self.clock()
        partitions = []
        for (kind, table, index, partition), w in sorted(self.windows.items(), key=lambda kv: tuple(str(p) for p in kv[0])):
            w.used(now)
            partitions.append(
                {
                    "table": table,
                    "index": index,
                    "partition": partition,
                    "kind": kind,
                    "units": round(w.total, 3),
                    "peak_units_per_s": round(w.peak, 3),
                    "throttled": w.throttled,
                }
            )
        return {
            "limits": {"write_units_per_s": self.limit["write"], "read_units_per_s": self.limit["read"]},
            "partitions": partitions,
            "throttled_requests": self.throttled_requests,
            "writes": {table: dict(ops) for table, ops in self.writes.items()},
        }


def _backend(environ, table_name):
    match = _REGION.search(environ.get("HTTP_AUTHORIZATION", ""))
    region = match.group(1) if match else None
    account = os.environ.get("MOTO_ACCOUNT_ID") or environ.get("HTTP_X_MOTO_ACCOUNT_ID")
    for account_id, regions in list(dynamodb_backends.items()):
        if account and account_id != account:
            continue
        for region_name in [region] if region else list(regions.keys()):
            if region_name in regions and table_name in regions[region_name].tables:
                return regions[region_name]
    return None


class Request:
    """One DynamoDB request: its writes' items before it ran (so a refused write can be put back)."""

    def __init__(self, environ, op, body, views):
        self.op, self.body = op, body
        self.views = views
        # (view, key, attributes before, billing factor, what kind of write, position in a transaction)
        self.touched = []
        if op in ("PutItem", "UpdateItem", "DeleteItem"):
            self._touch(environ, body, op, 1, None)
        elif op == "BatchWriteItem":
            for table_name, requests in body.get("RequestItems", {}).items():
                for r in requests:
                    if "PutRequest" in r:
                        self._touch(environ, {"TableName": table_name, **r["PutRequest"]}, "PutItem", 1, None)
                    elif "DeleteRequest" in r:
                        self._touch(environ, {"TableName": table_name, **r["DeleteRequest"]}, "DeleteItem", 1, None)
        elif op == "TransactWriteItems":
            for position, entry in enumerate(body.get("TransactItems", [])):
                (kind, part), = entry.items()
                self._touch(environ, part, kind, 2, position)

    def view(self, environ, table_name):
        if table_name not in self.views:
            backend = _backend(environ, table_name)
            self.views[table_name] = None if backend is None else TableView(backend, backend.tables[table_name])
        return self.views[table_name]

    def _touch(self, environ, part, kind, factor, position):
        view = self.view(environ, part.get("TableName", ""))
        if view is None:
            return
        key = part["Key"] if "Key" in part else view.key_of(part.get("Item", {}))
        self.touched.append((view, key, view.get(key), factor, kind, position))

    def bill_writes(self, applied):
        charges = Charges()
        for view, key, old, factor, kind, position in self.touched:
            if kind == "ConditionCheck" or not applied:
                # Read for its condition; nothing written: the table is billed, never an index.
                shown = old if old is not None else key
                charges.add("write", view, None, view.partition(shown), factor * write_units(item_size(old)), position)
            else:
                bill_write(charges, view, old, view.get(key), factor, position)
        return charges

    def count_writes(self, limits):
        tables = {view.name for view, *_ in self.touched}
        for view, _, _, _, kind, _ in self.touched:
            if kind == "ConditionCheck":
                continue
            if self.op == "TransactWriteItems":
                op = "TransactWriteItems" if len(tables) == 1 else "TransactWriteItems (with other tables)"
            else:
                op = self.op
            limits.writes[view.name][op] += 1

    def put_back(self):
        for view, key, old, *_ in reversed(self.touched):
            view.put_back(key, old)

    def bill_reads(self, environ, answer):
        charges = Charges()
        body = self.body
        if self.op == "GetItem":
            view = self.view(environ, body.get("TableName", ""))
            if view is not None:
                self._bill_get(charges, view, body["Key"], bool(body.get("ConsistentRead")), 1)
        elif self.op == "BatchGetItem":
            for table_name, spec in body.get("RequestItems", {}).items():
                view = self.view(environ, table_name)
                if view is not None:
                    for key in spec.get("Keys", []):
                        self._bill_get(charges, view, key, bool(spec.get("ConsistentRead")), 1)
        elif self.op == "TransactGetItems":
            for entry in body.get("TransactItems", []):
                get = entry.get("Get", {})
                view = self.view(environ, get.get("TableName", ""))
                if view is not None:
                    self._bill_get(charges, view, get["Key"], True, 2)
        elif self.op == "Query":
            view = self.view(environ, body.get("TableName", ""))
            if view is not None:
                self._bill_query(charges, view, body, answer)
        return charges

    def _bill_get(self, charges, view, key, consistent, factor):
        item = view.get(key)
        charges.add("read", view, None, view.partition(item or key), factor * read_units(item_size(item), consistent))

    def _bill_query(self, charges, view, body, answer):
        index_name = body.get("IndexName")
        index = next((i for i in view.indexes if i[0] == index_name), None)
        consistent = bool(body.get("ConsistentRead")) and index is None
        size, partition = 0, _query_partition(body, view, index)
        for shown in answer.get("Items", []):
            item = view.get(view.key_of(shown))
            if item is None:
                continue
            if index is None:
                size += item_size(item)
                partition = view.partition(item)
            else:
                entry = view.index_entry(index, item)
                if entry is not None:
                    size += item_size(entry[2])
                    partition = entry[0]
        if partition is not None:
            charges.add("read", view, index_name if index else None, partition, read_units(size, consistent))


def _query_partition(body, view, index):
    """The partition value a query names (from its key condition's `attr = :value`), if found."""
    attr = index[1][0] if index else view.keys[0]
    values = body.get("ExpressionAttributeValues", {})
    condition = body.get("KeyConditionExpression", "")
    for placeholder in [attr] + [k for k, v in body.get("ExpressionAttributeNames", {}).items() if v == attr]:
        m = re.search(re.escape(placeholder) + r"\s*=\s*(:[A-Za-z0-9_]+)", condition)
        if m and m.group(1) in values:
            return _scalar(values[m.group(1)])
    legacy = body.get("KeyConditions", {}).get(attr)
    if legacy and legacy.get("AttributeValueList"):
        return _scalar(legacy["AttributeValueList"][0])
    return None


_REASON = {
    ("write", False): "TableWriteKeyRangeThroughputExceeded",
    ("write", True): "IndexWriteKeyRangeThroughputExceeded",
    ("read", False): "TableReadKeyRangeThroughputExceeded",
    ("read", True): "IndexReadKeyRangeThroughputExceeded",
}


def _throttle_answer(op, charges, over):
    reasons = []
    for key in over:
        kind, _, index, _ = key
        reason = {"reason": _REASON[(kind, index is not None)], "resource": charges.arns[key]}
        if reason not in reasons:
            reasons.append(reason)
    where = ", ".join(f"{k[1]}{'/' + k[2] if k[2] else ''} partition {k[3]!r} ({k[0]})" for k in over)
    message = (
        "Throughput exceeds the current capacity for one or more partition key values "
        f"of your table or index: {where}"
    )
    if op == "TransactWriteItems":
        positions = {charges.item_of.get(key) for key in over}
        count = max((p for p in charges.item_of.values() if p is not None), default=-1) + 1
        cancellation = [
            {"Code": "ThrottlingError", "Message": message} if i in positions else {"Code": "None"} for i in range(count)
        ]
        codes = ", ".join(c["Code"] for c in cancellation)
        return {
            "__type": ERROR_PREFIX + "TransactionCanceledException",
            "message": f"Transaction cancelled, please refer cancellation reasons for specific reasons [{codes}]",
            "CancellationReasons": cancellation,
            "ThrottlingReasons": reasons,
        }
    return {"__type": ERROR_PREFIX + "ProvisionedThroughputExceededException", "message": message, "ThrottlingReasons": reasons}


class PartitionLimited:
    """WSGI middleware, run inside the engine's one-DynamoDB-request-at-a-time lock."""

    def __init__(self, app, limits):
        self.app = app
        self.limits = limits
        self.views = {}

    def stats(self, environ, start_response):
        if environ.get("REQUEST_METHOD") == "POST" and environ.get("PATH_INFO", "").endswith("/reset"):
            self.limits.reset()
        body = json.dumps(self.limits.report()).encode()
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]

    def __call__(self, environ, start_response):
        op = environ.get("HTTP_X_AMZ_TARGET", "").rpartition(".")[2]
        if op not in WRITE_OPS and op not in READ_OPS:
            if op in ("CreateTable", "DeleteTable", "UpdateTable"):
                self.views.clear()
            return self.app(environ, start_response)
        raw = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        environ["wsgi.input"] = io.BytesIO(raw)
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return self.app(environ, start_response)
        # Tables are looked up again per request (one may have been deleted and created anew).
        self.views = {}
        request = Request(environ, op, body, self.views)
        answered = {}

        def capture(status, headers, exc_info=None):
            answered["status"], answered["headers"] = status, headers
            return lambda _data: None

        out = b"".join(self.app(environ, capture))
        status = answered.get("status", "500")
        ok = status.startswith("200")
        if op in WRITE_OPS:
            cancelled = status.startswith("400") and (b"ConditionalCheckFailed" in out or b"TransactionCanceled" in out)
            if not ok and not cancelled:
                start_response(status, answered["headers"])
                return [out]
            charges = request.bill_writes(applied=ok)
        else:
            if not ok:
                start_response(status, answered["headers"])
                return [out]
            charges = request.bill_reads(environ, json.loads(out or b"{}"))
        over = self.limits.admit(charges)
        if over is None:
            if ok and op in WRITE_OPS:
                request.count_writes(self.limits)
            start_response(status, answered["headers"])
            return [out]
        if ok and op in WRITE_OPS:
            request.put_back()
        body = json.dumps(_throttle_answer(op, charges, over)).encode()
        start_response(
            "400 Bad Request",
            [
                ("Content-Type", "application/x-amz-json-1.0"),
                ("Content-Length", str(len(body))),
                ("x-amz-crc32", str(zlib.crc32(body))),
                ("x-amzn-RequestId", answered_request_id(answered)),
            ],
        )
        return [body]


def answered_request_id(answered):
    for name, value in answered.get("headers", []):
        if name.lower() == "x-amzn-requestid":
            return value
    return "leaselock-local-engine"
