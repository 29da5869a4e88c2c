"""Checks what scripts/local_engine.py changes in moto, over HTTP against a running engine.

    scripts/with-services.sh .venv/bin/python scripts/test_local_engine.py

Each test is a property the project's other tests rely on: DynamoDB's atomic conditional writes
and transactions, and SQS semantics (counts, delays, visibility, batch deletes) that the engine
reimplements faster. Run against a stock moto_server, the atomicity test fails. The per-partition
limits (scripts/partition_limits.py) and the lagging indexes (scripts/index_lag.py) are checked on
engines of this test's own, started on a free loopback port and stopped by their pid.
"""

import json
import os
import socket
import subprocess
import sys
import threading
import time
import unittest
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import boto3
from botocore.config import Config

ENDPOINT = os.environ.get("AWS_ENDPOINT_URL", "http://127.0.0.1:4566")
CONFIG = Config(max_pool_connections=64, retries={"total_max_attempts": 1})


def client(service, endpoint=None):
    return boto3.client(
        service,
        endpoint_url=endpoint or ENDPOINT,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=CONFIG,
    )


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


class DynamoDB(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ddb = client("dynamodb")
        cls.table = unique("engine")
        cls.ddb.create_table(
            TableName=cls.table,
            BillingMode="PAY_PER_REQUEST",
            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        )

    @classmethod
    def tearDownClass(cls):
        cls.ddb.delete_table(TableName=cls.table)

    def test_one_conditional_write_wins_a_race(self):
        rounds, racers = 30, 16
        for r in range(rounds):
            key = {"pk": {"S": f"race-{r}"}}
            barrier = threading.Barrier(racers)
            winners = []

            def claim(who):
                barrier.wait()
                try:
                    self.ddb.update_item(
                        TableName=self.table,
                        Key=key,
                        UpdateExpression="SET #o = :who",
                        ConditionExpression="attribute_not_exists(#o)",
                        ExpressionAttributeNames={"#o": "owner"},
                        ExpressionAttributeValues={":who": {"S": who}},
                    )
                    winners.append(who)
                except self.ddb.exceptions.ConditionalCheckFailedException:
                    pass

            threads = [threading.Thread(target=claim, args=(f"w{i}",)) for i in range(racers)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            self.assertEqual(len(winners), 1, f"round {r}: winners {winners}")
            owner = self.ddb.get_item(TableName=self.table, Key=key, ConsistentRead=True)["Item"]["owner"]["S"]
            self.assertEqual(owner, winners[0])

    def test_a_cancelled_transaction_changes_nothing(self):
        self.ddb.put_item(TableName=self.table, Item={"pk": {"S": "tx-a"}, "n": {"N": "1"}})
        self.ddb.put_item(TableName=self.table, Item={"pk": {"S": "tx-b"}, "n": {"N": "1"}})
        put_new = {"Put": {"TableName": self.table, "Item": {"pk": {"S": "tx-new"}, "n": {"N": "9"}}}}

        def set_a_to_two(**condition):
            update = {
                "TableName": self.table,
                "Key": {"pk": {"S": "tx-a"}},
                "UpdateExpression": "SET n = :two",
                "ExpressionAttributeValues": {":two": {"N": "2"}},
            }
            if condition:
                update["ConditionExpression"] = condition["expression"]
                update["ExpressionAttributeValues"].update(condition["values"])
            return {"Update": update}

        with self.assertRaises(self.ddb.exceptions.TransactionCanceledException):
            self.ddb.transact_write_items(
                TransactItems=[
                    put_new,
                    set_a_to_two(),
                    {
                        "ConditionCheck": {
                            "TableName": self.table,
                            "Key": {"pk": {"S": "tx-b"}},
                            "ConditionExpression": "n = :zero",
                            "ExpressionAttributeValues": {":zero": {"N": "0"}},
                        }
                    },
                ]
            )
        get = lambda pk: self.ddb.get_item(TableName=self.table, Key={"pk": {"S": pk}}, ConsistentRead=True)
        self.assertNotIn("Item", get("tx-new"))
        self.assertEqual(get("tx-a")["Item"]["n"]["N"], "1")

        # And one whose condition holds applies every part.
        self.ddb.transact_write_items(
            TransactItems=[put_new, set_a_to_two(expression="n = :one", values={":one": {"N": "1"}})]
        )
        self.assertEqual(get("tx-new")["Item"]["n"]["N"], "9")
        self.assertEqual(get("tx-a")["Item"]["n"]["N"], "2")


class SQS(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.sqs = client("sqs")

    def queue(self, **attributes):
        name = unique("engine")
        if attributes.get("FifoQueue") == "true":
            name += ".fifo"
        url = self.sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
        self.addCleanup(self.sqs.delete_queue, QueueUrl=url)
        return url

    def counts(self, url):
        names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
                 "ApproximateNumberOfMessagesDelayed"]
        got = self.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"]
        return tuple(int(got[n]) for n in names)

    def receive(self, url, n=10, visibility=30):
        return self.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=n, VisibilityTimeout=visibility).get(
            "Messages", []
        )

    def test_counts_delays_and_visibility(self):
        url = self.queue()
        for i in range(5):
            self.sqs.send_message(QueueUrl=url, MessageBody=f"m{i}")
        self.sqs.send_message(QueueUrl=url, MessageBody="later", DelaySeconds=60)
        self.assertEqual(self.counts(url), (5, 0, 1))
        got = self.receive(url, n=3)
        self.assertEqual(len(got), 3)
        self.assertEqual(self.counts(url), (2, 3, 1))
        rest = self.receive(url)
        self.assertEqual(sorted(m["Body"] for m in got + rest), [f"m{i}" for i in range(5)], "delayed stays hidden")
        self.assertEqual(self.receive(url), [])
        # Visible again once its visibility timeout is over.
        self.sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=rest[0]["ReceiptHandle"], VisibilityTimeout=0)
        again = self.receive(url)
        self.assertEqual([m["Body"] for m in again], [rest[0]["Body"]])

        all_attributes = self.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        for name in ("QueueArn", "VisibilityTimeout", "ApproximateNumberOfMessages", "DelaySeconds"):
            self.assertIn(name, all_attributes)

    def test_batch_delete_says_which_handles_were_valid(self):
        url = self.queue()
        self.sqs.send_message_batch(
            QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": f"m{i}"} for i in range(6)]
        )
        got = self.receive(url)
        self.assertEqual(len(got), 6)
        entries = [{"Id": f"e{i}", "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got[:3])]
        out = self.sqs.delete_message_batch(QueueUrl=url, Entries=entries + [{"Id": "bad", "ReceiptHandle": "x"}])
        self.assertEqual([s["Id"] for s in out["Successful"]], ["e0", "e1", "e2"])
        self.assertEqual([(f["Id"], f["Code"], f["SenderFault"]) for f in out["Failed"]],
                         [("bad", "ReceiptHandleIsInvalid", True)])
        # Deleting again is not an error; an unknown handle is.
        again = self.sqs.delete_message_batch(QueueUrl=url, Entries=entries[:1])
        self.assertEqual(again["Failed"], [])
        self.sqs.delete_message(QueueUrl=url, ReceiptHandle=got[3]["ReceiptHandle"])
        with self.assertRaises(self.sqs.exceptions.ReceiptHandleIsInvalid):
            self.sqs.delete_message(QueueUrl=url, ReceiptHandle="not-a-handle")
        self.assertEqual(self.counts(url), (0, 2, 0))

    def test_no_message_is_lost_while_others_are_deleted(self):
        url = self.queue()
        senders, per_sender = 4, 150
        expected = {f"s{s}-{i}" for s in range(senders) for i in range(per_sender)}
        received = set()
        refused = []
        done_sending = threading.Event()

        def send(s):
            for i in range(0, per_sender, 10):
                batch = [{"Id": str(j), "MessageBody": f"s{s}-{i + j}"} for j in range(10)]
                refused.extend(self.sqs.send_message_batch(QueueUrl=url, Entries=batch).get("Failed", []))

        def consume():
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not (done_sending.is_set() and received >= expected):
                got = self.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1).get(
                    "Messages", []
                )
                received.update(m["Body"] for m in got)
                if got:
                    self.sqs.delete_message_batch(
                        QueueUrl=url,
                        Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)],
                    )

        consumers = [threading.Thread(target=consume) for _ in range(3)]
        for c in consumers:
            c.start()
        threads = [threading.Thread(target=send, args=(s,)) for s in range(senders)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        done_sending.set()
        for c in consumers:
            c.join()
        self.assertEqual(refused, [])
        self.assertEqual(expected - received, set(), "messages lost")

    def test_fifo_deduplication_by_content(self):
        url = self.queue(FifoQueue="true", ContentBasedDeduplication="true")
        for _ in range(3):
            self.sqs.send_message(QueueUrl=url, MessageBody=json.dumps({"connection_id": "a"}), MessageGroupId="g")
        self.sqs.send_message(QueueUrl=url, MessageBody=json.dumps({"connection_id": "b"}), MessageGroupId="g")
        self.assertEqual(self.counts(url)[0], 2)
        attributes = self.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        self.assertEqual(attributes["ContentBasedDeduplication"], "true")
        self.assertEqual(attributes["FifoQueue"], "true")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answers(url):
    try:
        with urllib.request.urlopen(url, timeout=1):
            return True
    except OSError:
        return False


class OwnEngine:
    """scripts/local_engine.py on a free port with `env` added; stopped by its pid."""

    def __init__(self, **env):
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, **env)
        engine = Path(__file__).resolve().parent / "local_engine.py"
        self.process = subprocess.Popen(
            [sys.executable, str(engine), "-H", "127.0.0.1", "-p", str(self.port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while not answers(self.endpoint + "/moto-api/"):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the engine started by this test did not answer on {self.endpoint}")
            time.sleep(0.1)

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class LimitedEngine(OwnEngine):
    """An engine of the test's own with per-partition limits."""

    def __init__(self, wcu, rcu):
        super().__init__(LEASELOCK_PARTITION_WCU=str(wcu), LEASELOCK_PARTITION_RCU=str(rcu))

    def stats(self, reset=False):
        request = urllib.request.Request(
            self.endpoint + "/_leaselock/partitions" + ("/reset" if reset else ""), method="POST" if reset else "GET"
        )
        with urllib.request.urlopen(request, timeout=10) as r:
            return json.load(r)

    def partition(self, table, index, partition, kind="write"):
        for p in self.stats()["partitions"]:
            if (p["table"], p["index"], p["partition"], p["kind"]) == (table, index, partition, kind):
                return p
        return None



def S(v):
    return {"S": v}


def N(v):
    return {"N": str(v)}


def create_indexed_table(ddb, prefix):
    """A table keyed by `pk`, with a `by-state` (state, exp) index projecting every attribute
    and a `by-owner` index of keys only, as the lease table's indexes are."""
    table = unique(prefix)
    ddb.create_table(
        TableName=table,
        BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "state", "AttributeType": "S"},
            {"AttributeName": "exp", "AttributeType": "N"},
            {"AttributeName": "owner", "AttributeType": "S"},
        ],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        GlobalSecondaryIndexes=[
            {
                "IndexName": "by-state",
                "KeySchema": [
                    {"AttributeName": "state", "KeyType": "HASH"},
                    {"AttributeName": "exp", "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "ALL"},
            },
            {
                "IndexName": "by-owner",
                "KeySchema": [{"AttributeName": "owner", "KeyType": "HASH"}],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            },
        ],
    )
    return table


class ItemAnswers(unittest.TestCase):
    """The engine writes the answers to DynamoDB's item operations itself; with
    LEASELOCK_ENGINE_CHECK=1 it also runs moto's serializer and fails the request if the two
    differ. Every item operation, with binary values, sets, nested maps, empty and paged
    results, old and new values and consumed capacity."""

    @classmethod
    def setUpClass(cls):
        cls.engine = OwnEngine(LEASELOCK_ENGINE_CHECK="1")
        cls.ddb = client("dynamodb", cls.engine.endpoint)
        cls.table = create_indexed_table(cls.ddb, "answers")

    @classmethod
    def tearDownClass(cls):
        cls.engine.stop()

    def item(self, pk, exp):
        return {
            "pk": S(pk),
            "state": S("STARTED"),
            "exp": N(exp),
            "blob": {"B": bytes(range(256))},
            "tags": {"SS": ["a", "b"]},
            "nums": {"NS": ["1", "2.5"]},
            "bins": {"BS": [b"\x00", b"\xff"]},
            "doc": {"M": {"list": {"L": [S("x"), N(1), {"BOOL": True}, {"NULL": True}]}}},
        }

    def test_every_item_operation_answers_as_moto_would(self):
        t, ddb, cap = self.table, self.ddb, {"ReturnConsumedCapacity": "INDEXES"}
        for i in range(5):
            ddb.put_item(TableName=t, Item=self.item(f"a{i}", i), **cap)
        old = ddb.put_item(TableName=t, Item=self.item("a0", 10), ReturnValues="ALL_OLD", **cap)
        self.assertEqual(old["Attributes"]["blob"]["B"], bytes(range(256)))
        got = ddb.get_item(TableName=t, Key={"pk": S("a1")}, ConsistentRead=True, **cap)
        self.assertEqual(got["Item"]["bins"]["BS"], [b"\x00", b"\xff"])
        self.assertNotIn("Item", ddb.get_item(TableName=t, Key={"pk": S("none")}))
        new = ddb.update_item(
            TableName=t,
            Key={"pk": S("a2")},
            UpdateExpression="SET exp = :e ADD tags :t",
            ConditionExpression="attribute_exists(pk)",
            ExpressionAttributeValues={":e": N(20), ":t": {"SS": ["c"]}},
            ReturnValues="ALL_NEW",
            **cap,
        )
        self.assertEqual(sorted(new["Attributes"]["tags"]["SS"]), ["a", "b", "c"])
        pages = ddb.get_paginator("query").paginate(
            TableName=t,
            IndexName="by-state",
            KeyConditionExpression="#s = :s AND exp < :e",
            ExpressionAttributeNames={"#s": "state"},
            ExpressionAttributeValues={":s": S("STARTED"), ":e": N(100)},
            PaginationConfig={"PageSize": 2},
            **cap,
        )
        self.assertEqual(sum(p["Count"] for p in pages), 5)
        scanned = ddb.scan(TableName=t, Limit=3, **cap)
        self.assertIn("LastEvaluatedKey", scanned)
        self.assertEqual(ddb.scan(TableName=t, FilterExpression="exp > :e", ExpressionAttributeValues={":e": N(99)})["Count"], 0)
        batch = ddb.batch_get_item(RequestItems={t: {"Keys": [{"pk": S("a1")}, {"pk": S("none")}]}}, **cap)
        self.assertEqual(len(batch["Responses"][t]), 1)
        ddb.batch_write_item(RequestItems={t: [{"PutRequest": {"Item": self.item("b0", 1)}}, {"DeleteRequest": {"Key": {"pk": S("a4")}}}]}, **cap)
        ddb.transact_write_items(
            TransactItems=[
                {"ConditionCheck": {"TableName": t, "Key": {"pk": S("a1")}, "ConditionExpression": "attribute_exists(pk)"}},
                {"Put": {"TableName": t, "Item": self.item("c0", 2)}},
            ],
            **cap,
        )
        both = ddb.transact_get_items(TransactItems=[{"Get": {"TableName": t, "Key": {"pk": S("c0")}}}], **cap)
        self.assertEqual(both["Responses"][0]["Item"]["doc"]["M"]["list"]["L"][2], {"BOOL": True})
        gone = ddb.delete_item(TableName=t, Key={"pk": S("c0")}, ReturnValues="ALL_OLD", **cap)
        self.assertEqual(gone["Attributes"]["pk"], S("c0"))


def wait_until(moment):
    while (left := moment - time.monotonic()) > 0:
        time.sleep(left)


class IndexLagChecks:
    """Reads of the two indexes of `create_indexed_table`, and the timing of a lag's checks."""

    MARGIN = 0.15

    def by_state(self, state, table=None, **kw):
        got = self.ddb.query(TableName=table or self.table, IndexName="by-state", KeyConditionExpression="#s = :s",
                             ExpressionAttributeNames={"#s": "state"}, ExpressionAttributeValues={":s": S(state)}, **kw)
        return got["Items"]

    def count(self, state):
        got = self.ddb.query(TableName=self.table, IndexName="by-state", KeyConditionExpression="#s = :s",
                             ExpressionAttributeNames={"#s": "state"}, ExpressionAttributeValues={":s": S(state)},
                             Select="COUNT")
        self.assertNotIn("Items", got)
        return got["Count"]

    def by_owner(self, owner, table=None):
        got = self.ddb.query(TableName=table or self.table, IndexName="by-owner", KeyConditionExpression="#o = :o",
                             ExpressionAttributeNames={"#o": "owner"}, ExpressionAttributeValues={":o": S(owner)})
        return sorted(i["pk"]["S"] for i in got["Items"])

    def get(self, pk, table=None):
        return self.ddb.get_item(TableName=table or self.table, Key={"pk": S(pk)}, ConsistentRead=True).get("Item")

    def write(self, call):
        """Runs a write; returns (monotonic time before it, after it)."""
        before = time.monotonic()
        call()
        return before, time.monotonic()

    def still_within(self, since, lag):
        """Asserts that the reads since `since` (before a write) all ended within the lag."""
        self.assertLess(time.monotonic() - since, lag, "the reads took longer than the lag: they prove nothing")

    def past(self, until, lag):
        """Waits until the lag after a write that ended at `until` is over."""
        wait_until(until + lag + self.MARGIN)


class LaggedIndexes(IndexLagChecks, unittest.TestCase):
    """LEASELOCK_ENGINE_INDEX_LAG_MS: every GSI read answers from the index as it was LAG ago (the
    by-owner index OWNER_LAG ago); table reads answer at once. Each check within the lag ends
    before write + lag (asserted), each check after it starts after write + lag + margin."""

    LAG, OWNER_LAG = 0.8, 0.3

    @classmethod
    def setUpClass(cls):
        cls.engine = OwnEngine(LEASELOCK_ENGINE_INDEX_LAG_MS=f"{int(cls.LAG * 1000)},by-owner={int(cls.OWNER_LAG * 1000)}")
        cls.ddb = client("dynamodb", cls.engine.endpoint)
        cls.table = create_indexed_table(cls.ddb, "lagged")
        # The items the tests change, in the indexes once the lag is over.
        item = lambda pk, state, exp, owner: {"pk": S(pk), "state": S(state), "exp": N(exp), "owner": S(owner),
                                              "v": S("old")}
        items = [item("c-1", "C-OLD", 10, "c-a"), item("d-1", "D", 1, "d-a"), item("d-2", "D", 1, "d-a")]
        items += [{"pk": S(f"p-{i}"), "state": S("P"), "exp": N(i)} for i in range(5)]
        cls.ddb.batch_write_item(RequestItems={cls.table: [{"PutRequest": {"Item": i}} for i in items]})
        wait_until(time.monotonic() + cls.LAG + cls.MARGIN)

    @classmethod
    def tearDownClass(cls):
        cls.engine.stop()

    def test_a_changed_item_is_listed_at_its_old_place_with_its_old_values(self):
        start, end = self.write(lambda: self.ddb.update_item(
            TableName=self.table, Key={"pk": S("c-1")}, UpdateExpression="SET #s = :s, exp = :e, #o = :o, v = :v",
            ExpressionAttributeNames={"#s": "state", "#o": "owner"},
            ExpressionAttributeValues={":s": S("C-NEW"), ":e": N(20), ":o": S("c-b"), ":v": S("new")}))
        self.assertEqual(self.by_owner("c-a"), ["c-1"])
        self.assertEqual(self.by_owner("c-b"), [])
        self.still_within(start, self.OWNER_LAG)
        old = self.by_state("C-OLD")
        self.assertEqual([(i["pk"], i["exp"], i["owner"], i["v"]) for i in old], [(S("c-1"), N(10), S("c-a"), S("old"))])
        self.assertEqual(self.by_state("C-NEW"), [])
        # The table answers at once: GetItem, consistent or not, and a consistent query.
        self.assertEqual(self.get("c-1")["v"], S("new"))
        self.assertEqual(self.ddb.get_item(TableName=self.table, Key={"pk": S("c-1")})["Item"]["owner"], S("c-b"))
        queried = self.ddb.query(TableName=self.table, KeyConditionExpression="pk = :p", ConsistentRead=True,
                                 ExpressionAttributeValues={":p": S("c-1")})["Items"]
        self.assertEqual(queried[0]["state"], S("C-NEW"))
        self.still_within(start, self.LAG)
        self.past(end, self.OWNER_LAG)
        self.assertEqual((self.by_owner("c-a"), self.by_owner("c-b")), ([], ["c-1"]), "by-owner lags less")
        self.assertEqual(len(self.by_state("C-OLD")), 1, "by-state still lags")
        self.still_within(start, self.LAG)
        self.past(end, self.LAG)
        self.assertEqual(self.by_state("C-OLD"), [])
        new = self.by_state("C-NEW")
        self.assertEqual([(i["exp"], i["owner"], i["v"]) for i in new], [(N(20), S("c-b"), S("new"))])

    def test_a_new_item_is_missing_then_listed(self):
        start, end = self.write(lambda: self.ddb.put_item(TableName=self.table, Item={"pk": S("n-1"), "state": S("N"),
                                                                                      "exp": N(1), "owner": S("n-a")}))
        self.assertEqual(self.by_state("N"), [])
        self.assertEqual(self.count("N"), 0)
        self.assertEqual(self.ddb.scan(TableName=self.table, IndexName="by-state", FilterExpression="#s = :s",
                                       ExpressionAttributeNames={"#s": "state"},
                                       ExpressionAttributeValues={":s": S("N")})["Items"], [])
        self.assertIsNotNone(self.get("n-1"))
        self.still_within(start, self.LAG)
        self.past(end, self.LAG)
        self.assertEqual([i["pk"] for i in self.by_state("N")], [S("n-1")])
        self.assertEqual(self.count("N"), 1)

    def test_a_deleted_item_or_one_that_left_a_sparse_index_is_still_listed(self):
        start, _ = self.write(lambda: self.ddb.delete_item(TableName=self.table, Key={"pk": S("d-1")}))
        _, end = self.write(lambda: self.ddb.update_item(
            TableName=self.table, Key={"pk": S("d-2")}, UpdateExpression="REMOVE #o",
            ExpressionAttributeNames={"#o": "owner"}))
        self.assertEqual(self.by_owner("d-a"), ["d-1", "d-2"])
        self.still_within(start, self.OWNER_LAG)
        self.assertEqual(sorted(i["pk"]["S"] for i in self.by_state("D")), ["d-1", "d-2"])
        self.assertIsNone(self.get("d-1"))
        self.still_within(start, self.LAG)
        self.past(end, self.LAG)
        self.assertEqual([i["pk"] for i in self.by_state("D")], [S("d-2")])
        self.assertEqual(self.by_owner("d-a"), [])

    def test_pages_of_a_lagged_index_are_pages_of_the_index_as_it_was(self):
        start, end = self.write(lambda: self.ddb.transact_write_items(TransactItems=[
            {"Delete": {"TableName": self.table, "Key": {"pk": S("p-1")}}},
            {"Put": {"TableName": self.table, "Item": {"pk": S("p-9"), "state": S("P"), "exp": N(9)}}},
            {"Update": {"TableName": self.table, "Key": {"pk": S("p-3")}, "UpdateExpression": "SET exp = :e",
                        "ExpressionAttributeValues": {":e": N(30)}}},
        ]))

        def pages():
            pages = self.ddb.get_paginator("query").paginate(
                TableName=self.table, IndexName="by-state", KeyConditionExpression="#s = :s AND exp < :top",
                ExpressionAttributeNames={"#s": "state"}, ExpressionAttributeValues={":s": S("P"), ":top": N(100)},
                PaginationConfig={"PageSize": 2})
            return [(i["pk"]["S"], i["exp"]["N"]) for p in pages for i in p["Items"]]

        self.assertEqual(pages(), [(f"p-{i}", str(i)) for i in range(5)])
        self.still_within(start, self.LAG)
        self.past(end, self.LAG)
        self.assertEqual(pages(), [("p-0", "0"), ("p-2", "2"), ("p-4", "4"), ("p-9", "9"), ("p-3", "30")])

    def test_a_consistent_read_of_a_gsi_is_refused(self):
        for read in (lambda: self.by_state("X", ConsistentRead=True),
                     lambda: self.ddb.scan(TableName=self.table, IndexName="by-owner", ConsistentRead=True)):
            with self.assertRaises(self.ddb.exceptions.ClientError) as caught:
                read()
            error = caught.exception.response["Error"]
            self.assertEqual((error["Code"], error["Message"]),
                             ("ValidationException", "Consistent reads are not supported on global secondary indexes"))

    def test_the_setting_read_from_the_environment(self):
        import index_lag

        self.assertEqual(index_lag.settings_from_env({}), (0, {}))
        self.assertEqual(index_lag.settings_from_env({"LEASELOCK_ENGINE_INDEX_LAG_MS": "1000"}), (1000, {}))
        self.assertEqual(index_lag.settings_from_env({"LEASELOCK_ENGINE_INDEX_LAG_MS": "1000, lease_owner-index=3000"}),
                         (1000, {"lease_owner-index": 3000}))
        self.assertEqual(index_lag.settings_from_env({"LEASELOCK_ENGINE_INDEX_LAG_MS": "by-owner=5"}), (0, {"by-owner": 5}))
        for bad in ("-1", "1.5", "by-owner=", "x"):
            with self.assertRaises(SystemExit):
                index_lag.settings_from_env({"LEASELOCK_ENGINE_INDEX_LAG_MS": bad})


class IndexLagAtRunTime(IndexLagChecks, unittest.TestCase):
    """POST /_leaselock/index-lag lags the indexes of one table of an engine started without a lag."""

    LAG = 0.5

    @classmethod
    def setUpClass(cls):
        cls.engine = OwnEngine()
        cls.ddb = client("dynamodb", cls.engine.endpoint)
        cls.table = create_indexed_table(cls.ddb, "lag-mine")
        cls.other = create_indexed_table(cls.ddb, "lag-other")

    @classmethod
    def tearDownClass(cls):
        cls.engine.stop()

    def control(self, body=None):
        request = urllib.request.Request(self.engine.endpoint + "/_leaselock/index-lag",
                                         data=None if body is None else json.dumps(body).encode(),
                                         method="GET" if body is None else "POST")
        with urllib.request.urlopen(request, timeout=10) as r:
            return json.load(r)

    def put(self, table, pk, owner):
        self.ddb.put_item(TableName=table, Item={"pk": S(pk), "owner": S(owner)})

    def test_one_table_lags_and_the_others_do_not(self):
        self.assertEqual(self.control(), {"default_ms": 0, "indexes": {}, "tables": {}})
        # Unlagged, an index answers at once (as moto does).
        self.put(self.table, "r-0", "r-a")
        self.assertEqual(self.by_owner("r-a"), ["r-0"])
        ms = int(self.LAG * 1000)
        self.assertEqual(self.control({"table": self.table, "ms": ms})["tables"],
                         {self.table: {"ms": ms, "indexes": {}}})
        start, end = self.write(lambda: (self.put(self.table, "r-1", "r-a"), self.put(self.other, "r-1", "r-a")))
        self.assertEqual(self.by_owner("r-a"), ["r-0"])
        self.assertEqual(self.by_owner("r-a", table=self.other), ["r-1"])
        self.still_within(start, self.LAG)
        self.past(end, self.LAG)
        self.assertEqual(self.by_owner("r-a"), ["r-0", "r-1"])
        # One index of the table back to no lag; then the table's setting removed.
        self.control({"table": self.table, "index": "by-owner", "ms": 0})
        self.put(self.table, "r-2", "r-a")
        self.assertEqual(self.by_owner("r-a"), ["r-0", "r-1", "r-2"])
        settings = self.control({"table": self.table, "ms": None})
        self.assertEqual(settings["tables"], {self.table: {"ms": None, "indexes": {"by-owner": 0}}})
        self.control({"table": self.table, "index": "by-owner", "ms": None})
        self.assertEqual(self.control()["tables"], {})

    def test_a_bad_setting_is_refused(self):
        for body in ({"ms": 5}, {"table": self.table}, {"table": self.table, "ms": -1},
                     {"table": self.table, "ms": "5"}):
            with self.assertRaises(urllib.error.HTTPError) as caught:
                self.control(body)
            self.assertEqual(caught.exception.code, 400, body)
            self.assertIn("message", json.load(caught.exception))

    def test_a_consistent_read_of_a_gsi_is_refused_without_a_lag(self):
        with self.assertRaises(self.ddb.exceptions.ClientError) as caught:
            self.by_owner_consistent()
        self.assertEqual(caught.exception.response["Error"]["Message"],
                         "Consistent reads are not supported on global secondary indexes")

    def by_owner_consistent(self):
        self.ddb.query(TableName=self.other, IndexName="by-owner", KeyConditionExpression="#o = :o",
                       ConsistentRead=True, ExpressionAttributeNames={"#o": "owner"},
                       ExpressionAttributeValues={":o": S("x")})


class PartitionLimits(unittest.TestCase):
    """Units billed per partition key value as DynamoDB bills them, refused past the limit.

    Limits: 10 write units/s, 5 read units/s. Item sizes are chosen so that two requests in a
    row (well within one second) cross a limit, so no test depends on the machine's speed.
    """

    WCU, RCU = 10, 5

    @classmethod
    def setUpClass(cls):
        cls.engine = LimitedEngine(cls.WCU, cls.RCU)
        cls.ddb = client("dynamodb", cls.engine.endpoint)
        cls.table = create_indexed_table(cls.ddb, "limited")

    @classmethod
    def tearDownClass(cls):
        cls.engine.stop()

    def setUp(self):
        # Every test uses partition key values of its own; a reset also empties every window.
        self.engine.stats(reset=True)

    def put(self, pk, size_kb=0, **attrs):
        item = {"pk": S(pk), **attrs}
        if size_kb:
            item["pad"] = S("x" * (size_kb * 1024 - 3 - 4 - len(pk) - 10))
        self.ddb.put_item(TableName=self.table, Item=item)

    def assert_throttled(self, call, reason, resource_suffix=""):
        with self.assertRaises(self.ddb.exceptions.ProvisionedThroughputExceededException) as caught:
            call()
        response = caught.exception.response
        self.assertEqual(response["ResponseMetadata"]["HTTPStatusCode"], 400)
        reasons = response.get("ThrottlingReasons") or []
        self.assertIn(reason, [r["reason"] for r in reasons], response)
        if resource_suffix:
            self.assertTrue(any(r["resource"].endswith(resource_suffix) for r in reasons), reasons)

    def test_table_writes_are_billed_per_kb_and_limited_per_partition_value(self):
        self.put("w-hot", size_kb=6)  # 6 units of 10
        self.assert_throttled(lambda: self.put("w-hot", size_kb=6, v=N(2)), "TableWriteKeyRangeThroughputExceeded",
                              f"table/{self.table}")
        # Refused means not applied.
        got = self.ddb.get_item(TableName=self.table, Key={"pk": S("w-hot")}, ConsistentRead=True)["Item"]
        self.assertNotIn("v", got)
        # Another partition key value has a budget of its own.
        self.put("w-other", size_kb=6)
        hot = self.engine.partition(self.table, None, "w-hot")
        self.assertEqual((hot["units"], hot["throttled"]), (6, 1))
        # The window slides: the same write passes once the first has aged out.
        deadline = time.monotonic() + 5
        while True:
            try:
                self.put("w-hot", size_kb=6, v=N(3))
                break
            except self.ddb.exceptions.ProvisionedThroughputExceededException:
                self.assertLess(time.monotonic(), deadline, "the window never slid")
                time.sleep(0.1)

    def test_an_index_key_change_costs_two_index_writes_on_the_index_partition(self):
        # Items on distinct table partitions, one index partition value: the index is the hot spot.
        for i in range(2):
            self.put(f"i-{i}", state=S("STARTED"), exp=N(1000), owner=S("a"))
        self.engine.stats(reset=True)

        def renew(pk, exp):
            self.ddb.update_item(
                TableName=self.table,
                Key={"pk": S(pk)},
                UpdateExpression="SET #e = :e",
                ConditionExpression="#o = :a",
                ExpressionAttributeNames={"#e": "exp", "#o": "owner"},
                ExpressionAttributeValues={":e": N(exp), ":a": S("a")},
            )

        for exp in range(2001, 2006):  # 5 renewals x 2 index units = the limit
            renew("i-0", exp)
        started = self.engine.partition(self.table, "by-state", "STARTED")
        self.assertEqual(started["units"], 10)
        # The owner index (keys only) is not written: its key and projection did not change.
        self.assertIsNone(self.engine.partition(self.table, "by-owner", "a"))
        # A table write to a cold table partition that the index partition cannot absorb.
        self.assert_throttled(lambda: renew("i-1", 3000), "IndexWriteKeyRangeThroughputExceeded",
                              f"table/{self.table}/index/by-state")
        got = self.ddb.get_item(TableName=self.table, Key={"pk": S("i-1")}, ConsistentRead=True)["Item"]
        self.assertEqual(got["exp"], N(1000), "a refused write is not applied")
        self.assertEqual(self.engine.partition(self.table, "by-state", "STARTED")["throttled"], 1)
        self.assertEqual(self.engine.partition(self.table, None, "i-0")["units"], 5)

    def test_entering_leaving_and_moving_between_index_partitions(self):
        self.put("m-0")
        self.ddb.update_item(TableName=self.table, Key={"pk": S("m-0")}, UpdateExpression="SET #o = :o",
                             ExpressionAttributeNames={"#o": "owner"}, ExpressionAttributeValues={":o": S("x")})
        self.ddb.update_item(TableName=self.table, Key={"pk": S("m-0")}, UpdateExpression="SET #o = :o",
                             ExpressionAttributeNames={"#o": "owner"}, ExpressionAttributeValues={":o": S("y")})
        self.ddb.update_item(TableName=self.table, Key={"pk": S("m-0")}, UpdateExpression="REMOVE #o",
                             ExpressionAttributeNames={"#o": "owner"})
        # x: insert, then delete; y: insert, then delete.
        self.assertEqual(self.engine.partition(self.table, "by-owner", "x")["units"], 2)
        self.assertEqual(self.engine.partition(self.table, "by-owner", "y")["units"], 2)
        self.assertIsNone(self.engine.partition(self.table, "by-state", "STARTED"))
        self.assertEqual(self.engine.partition(self.table, None, "m-0")["units"], 4)
        # A failed condition is billed on the table (the item as it was), never on an index.
        with self.assertRaises(self.ddb.exceptions.ConditionalCheckFailedException):
            self.ddb.update_item(TableName=self.table, Key={"pk": S("m-0")}, UpdateExpression="SET #o = :o",
                                 ConditionExpression="attribute_exists(#o)",
                                 ExpressionAttributeNames={"#o": "owner"}, ExpressionAttributeValues={":o": S("z")})
        self.assertEqual(self.engine.partition(self.table, None, "m-0")["units"], 5)
        self.assertIsNone(self.engine.partition(self.table, "by-owner", "z"))
        writes = self.engine.stats()["writes"][self.table]
        self.assertEqual(writes, {"PutItem": 1, "UpdateItem": 3})

    def test_reads_4kb_per_unit_eventually_consistent_halves(self):
        self.put("r-big", size_kb=9)  # 3 read units consistent, 1.5 eventually consistent
        get = lambda consistent: self.ddb.get_item(TableName=self.table, Key={"pk": S("r-big")},
                                                   ConsistentRead=consistent)
        get(True)  # 3 of 5
        self.assert_throttled(lambda: get(True), "TableReadKeyRangeThroughputExceeded")
        get(False)  # 1.5 more: 4.5
        self.assert_throttled(lambda: get(False), "TableReadKeyRangeThroughputExceeded")
        big = self.engine.partition(self.table, None, "r-big", "read")
        self.assertEqual((big["units"], big["peak_units_per_s"], big["throttled"]), (4.5, 4.5, 2))

    def test_an_index_query_is_billed_on_its_partition_value(self):
        self.put("q-0", state=S("QUERIED"), exp=N(5))
        self.engine.stats(reset=True)
        got = self.ddb.query(TableName=self.table, IndexName="by-state",
                             KeyConditionExpression="#s = :s AND #e < :c",
                             ExpressionAttributeNames={"#s": "state", "#e": "exp"},
                             ExpressionAttributeValues={":s": S("QUERIED"), ":c": N(10)})
        self.assertEqual(got["Count"], 1)
        self.ddb.query(TableName=self.table, IndexName="by-state", KeyConditionExpression="#s = :s",
                       ExpressionAttributeNames={"#s": "state"}, ExpressionAttributeValues={":s": S("EMPTY")})
        self.assertEqual(self.engine.partition(self.table, "by-state", "QUERIED", "read")["units"], 0.5)
        self.assertEqual(self.engine.partition(self.table, "by-state", "EMPTY", "read")["units"], 0.5)

    def test_a_throttled_transaction_item_cancels_the_transaction(self):
        self.put("t-hot", size_kb=6)
        update = lambda pk: {"Update": {"TableName": self.table, "Key": {"pk": S(pk)}, "UpdateExpression": "SET v = :v",
                                        "ExpressionAttributeValues": {":v": N(1)}}}
        # 2 x 6 units on t-hot (over the limit with the put above), 2 x 1 on t-cold.
        with self.assertRaises(self.ddb.exceptions.TransactionCanceledException) as caught:
            self.ddb.transact_write_items(TransactItems=[update("t-cold"), update("t-hot")])
        codes = [r["Code"] for r in caught.exception.response["CancellationReasons"]]
        self.assertEqual(codes, ["None", "ThrottlingError"])
        for pk in ("t-cold", "t-hot"):
            got = self.ddb.get_item(TableName=self.table, Key={"pk": S(pk)}, ConsistentRead=True).get("Item", {})
            self.assertNotIn("v", got, f"{pk}: a cancelled transaction changes nothing")

    def test_without_the_variables_nothing_is_limited(self):
        ddb = client("dynamodb")  # the shared engine, started without limits
        table = unique("unlimited")
        ddb.create_table(TableName=table, BillingMode="PAY_PER_REQUEST",
                         AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                         KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}])
        try:
            for i in range(3):
                ddb.put_item(TableName=table, Item={"pk": S("hot"), "v": N(i), "pad": S("x" * 300_000)})
        finally:
            ddb.delete_table(TableName=table)


if __name__ == "__main__":
    unittest.main(verbosity=2)
