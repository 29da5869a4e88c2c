"""Checks what scripts/local_engine.py changes in moto, over HTTP against a running engine.

    scripts/with-services.sh .venv/bin/python scripts/test_local_engine.py

Each test is a property the project's other tests rely on: DynamoDB's atomic conditional writes
and transactions, and SQS semantics (counts, delays, visibility, batch deletes) that the engine
reimplements faster. Run against a stock moto_server, the atomicity test fails.
"""

import json
import os
import threading
import time
import unittest
import uuid

import boto3
from botocore.config import Config

ENDPOINT = os.environ.get("AWS_ENDPOINT_URL", "http://127.0.0.1:4566")
CONFIG = Config(max_pool_connections=64, retries={"max_attempts": 1})


def client(service):
    return boto3.client(
        service,
        endpoint_url=ENDPOINT,
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


if __name__ == "__main__":
    unittest.main(verbosity=2)
