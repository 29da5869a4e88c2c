"""The cross-language conformance scenarios (``tests/conformance/*.json``, format in its README)
replayed through ``leaselock.LeaseTable``, one test per scenario; raw item reads and writes go
through boto3. ``CONFORMANCE_DIR`` points the runner at another directory."""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import boto3
import pytest

import leaselock

ROOT = Path(__file__).resolve().parents[3]
# A relative CONFORMANCE_DIR is taken from the repository's root, as in the other runners.
DIR = ROOT / os.environ.get("CONFORMANCE_DIR", "tests/conformance")


def _load() -> List[Dict[str, Any]]:
    out: List[Dict[str, Any]] = []
    for file in sorted(DIR.glob("*.json")):
        doc = json.loads(file.read_text())
        for s in doc["scenarios"] if "scenarios" in doc else [doc]:
            assert s["name"] not in [o["name"] for o in out], f"two scenarios named {s['name']}"
            out.append(s)
    assert out, f"no scenarios in {DIR}"
    return out


SCENARIOS = _load()

# The error classes in the scenarios' vocabulary, subclasses before their bases.
ERRORS: List[Tuple[type, str, Callable[[Any], Dict[str, Any]]]] = [
    (leaselock.LeaseHeld, "held", lambda e: {"owner": e.owner, "expires_at_ms": e.expires_at_ms}),
    (leaselock.LeaseLost, "lost", lambda e: {}),
    (leaselock.LeaseNotFound, "not_found", lambda e: {}),
    (leaselock.LeaseStopped, "stopped", lambda e: {}),
    (leaselock.SeqNotIncreasing, "seq_not_increasing", lambda e: {"last_seq": e.last_seq, "seq": e.seq}),
    (leaselock.InvalidInput, "invalid_input", lambda e: {"field": e.field}),
    (leaselock.Throttled, "throttled", lambda e: {}),
    (leaselock.Timeout, "timeout", lambda e: {}),
    (leaselock.Unreachable, "unreachable", lambda e: {}),
    (leaselock.AccessDenied, "access_denied", lambda e: {}),
    (leaselock.TableNotFound, "table_not_found", lambda e: {}),
    (leaselock.StoreError, "store", lambda e: {"message": str(e)}),
]


def error_value(e: BaseException) -> Dict[str, Any]:
    for cls, name, fields in ERRORS:
        if isinstance(e, cls):
            return {"error": name, **fields(e)}
    raise e


def now_ms() -> int:
    return int(time.time() * 1000)


def text(v: Any) -> str:
    """A string argument; ``{"repeat": s, "times": n}`` builds a long one."""
    if isinstance(v, dict) and "repeat" in v:
        return v["repeat"] * v["times"]
    assert isinstance(v, str), v
    return v


def lease_value(l: Any) -> Dict[str, Any]:
    return {"id": l.id, "owner": l.owner, "fence": l.fence, "expires_at_ms": l.expires_at_ms,
            "last_seq": l.last_seq, "url": l.url, "desired_state": l.desired_state}


item_value = lease_value


def session_value(s: Any) -> Dict[str, Any]:
    """A Session, or a listed session item (an object or a mapping with the same names)."""
    get = s.get if isinstance(s, dict) else lambda k: getattr(s, k)
    return {"owner": get("owner"), "epoch": get("epoch"), "expires_at_ms": get("expires_at_ms")}


def raw_value(item: Optional[Dict[str, Any]]) -> Any:
    """A raw DynamoDB item as the scenarios write it: S as a string, N as a number."""
    if item is None:
        return None
    out: Dict[str, Any] = {}
    for k, v in item.items():
        if "S" in v:
            out[k] = v["S"]
        elif "N" in v:
            out[k] = int(v["N"]) if v["N"].lstrip("-").isdigit() else {"N": v["N"]}
        else:
            out[k] = repr(v)
    return out


def table_options(options: Dict[str, Any]) -> Dict[str, Any]:
    keys = ("lease_ms", "renew_ms", "clock_skew_ms", "key_prefix", "index_name", "attributes", "mode")
    unknown = set(options) - set(keys)
    assert not unknown, f"unknown table options {unknown}"
    return dict(options)


class Mismatch(AssertionError):
    pass


class Run:
    def __init__(self, scenario: Dict[str, Any]) -> None:
        safe = "".join(c if c.isalnum() or c == "-" else "-" for c in scenario["name"])
        self.table_name = f"conf-python-{safe}-{uuid.uuid4().hex[:8]}"
        self.options = table_options(scenario.get("table", {}))
        self.table = leaselock.LeaseTable(self.table_name, **self.options)
        self.table.create_table()
        self.ddb = boto3.client("dynamodb")
        names = self.options.get("attributes", {})
        self.id_attr = names.get("id", "connection_id")
        self.exp_attr = names.get("expires_at_ms", "lease_expires_at_ms")
        self.prefix = self.options.get("key_prefix", "")
        self.leases: Dict[str, Any] = {}
        self.sessions: Dict[str, Any] = {}
        self.vars: Dict[str, Any] = {}

    # -- library steps --------------------------------------------------------------------

    def save_lease(self, name: Optional[str], lease: Any) -> Dict[str, Any]:
        view = lease_value(lease)
        if name is not None:
            self.leases[name] = lease
            self.vars[name] = view
        return view

    def save_session(self, name: Optional[str], session: Any) -> Dict[str, Any]:
        view = session_value(session)
        if name is not None:
            self.sessions[name] = session
            self.vars[name] = view
        return view

    def call(self, step: Dict[str, Any]) -> Any:
        op, name, t = step["op"], step.get("as"), self.table
        if op == "start":
            return item_value(t.start(text(step["id"]), text(step["url"])))
        if op == "stop":
            return item_value(t.stop(text(step["id"])))
        if op == "acquire":
            return self.save_lease(name, t.acquire(text(step["id"]), text(step["owner"])))
        if op in ("renew", "checkpoint", "release"):
            lease = self.leases[step["lease"]]
            if op == "renew":
                lease.renew()
            elif op == "checkpoint":
                lease.checkpoint(step["seq"])
            else:
                lease.release()
            return self.save_lease(step["lease"], lease)
        if op == "get":
            item = t.get(text(step["id"]))
            return None if item is None else item_value(item)
        if op == "orphans":
            return {"ids": [i.id for i in t.orphans(step.get("limit"))]}
        if op == "owned_by":
            return {"ids": [i.id for i in t.owned_by(text(step["owner"]))]}
        if op == "desired_states":
            return {"states": dict(t.desired_states([text(i) for i in step["ids"]]))}
        if op == "open":
            leaselock.LeaseTable(self.table_name, **table_options({**self.options, **step["table"]}))
            return {}
        if op == "create_session":
            session = t.create_session(text(step["owner"]), previous_epoch=step.get("previous_epoch"))
            return self.save_session(name, session)
        if op in ("renew_session", "end_session"):
            session = self.sessions[step["session"]]
            session.renew() if op == "renew_session" else session.end()
            return self.save_session(step["session"], session)
        if op == "claim":
            return self.save_lease(name, self.sessions[step["session"]].claim(text(step["id"])))
        if op == "sessions":
            listed = sorted((session_value(s) for s in t.sessions()), key=lambda s: s["owner"])
            return {"sessions": listed}
        raise AssertionError(f"unknown op {op}")

    def contend(self, step: Dict[str, Any]) -> Dict[str, Any]:
        owners = [text(o) for o in step["owners"]]
        barrier = threading.Barrier(len(owners))
        results: List[Any] = [None] * len(owners)

        def claim(n: int) -> None:
            barrier.wait()
            try:
                results[n] = self.table.acquire(text(step["id"]), owners[n])
            except leaselock.LeaseLockError as e:
                results[n] = e

        threads = [threading.Thread(target=claim, args=(n,)) for n in range(len(owners))]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        winners = [r for r in results if not isinstance(r, BaseException)]
        held = [r.owner for r in results if isinstance(r, leaselock.LeaseHeld)]
        others = [error_value(r) for r in results if isinstance(r, BaseException) and not isinstance(r, leaselock.LeaseHeld)]
        got: Dict[str, Any] = {"winners": len(winners), "held": len(held), "others": others,
                               "held_names_winner": len(winners) == 1 and all(o == winners[0].owner for o in held)}
        if winners:
            got["fence"], got["owner"] = winners[0].fence, winners[0].owner
            self.save_lease(step.get("as"), winners[0])
        return got

    # -- raw steps (boto3, behind the library's back) ----------------------------------------

    def raw_key(self, step: Dict[str, Any]) -> str:
        if "raw_key" in step:
            return text(step["raw_key"])
        if "session" in step:
            return f"{self.prefix}session/{text(step['session'])}"
        return self.prefix + text(step["id"])

    def read_raw(self, key: str) -> Any:
        out = self.ddb.get_item(TableName=self.table_name, Key={self.id_attr: {"S": key}}, ConsistentRead=True)
        return raw_value(out.get("Item"))

    def attribute(self, v: Any) -> Dict[str, str]:
        if isinstance(v, str):
            return {"S": v}
        if isinstance(v, bool) or not isinstance(v, (int, dict)):
            raise AssertionError(f"not a raw attribute value: {v!r}")
        if isinstance(v, int):
            return {"N": str(v)}
        if "now_plus_ms" in v:
            return {"N": str(now_ms() + v["now_plus_ms"])}
        return dict(v)

    def put_raw(self, step: Dict[str, Any]) -> None:
        item = {k: self.attribute(v) for k, v in step["item"].items()}
        self.ddb.put_item(TableName=self.table_name, Item=item)

    def age(self, step: Dict[str, Any]) -> None:
        self.ddb.update_item(
            TableName=self.table_name,
            Key={self.id_attr: {"S": self.raw_key(step)}},
            UpdateExpression="SET #exp = :exp",
            ConditionExpression="attribute_exists(#id)",
            ExpressionAttributeNames={"#exp": self.exp_attr, "#id": self.id_attr},
            ExpressionAttributeValues={":exp": {"N": str(now_ms() + step["expires_in_ms"])}},
        )

    def expect_item(self, step: Dict[str, Any]) -> None:
        key = self.raw_key(step)
        got = self.read_raw(key)
        if "same_as" in step:
            saved = self.vars[step["same_as"]]
            if saved != got:
                raise Mismatch(f"item {key} changed: was {saved}, now {got}")
            return
        want = step["item"]
        if want is None or got is None:
            if want != got:
                raise Mismatch(f"item {key}: expected {want}, got {got}")
            return
        extra = [k for k in got if k not in want]
        if extra:
            raise Mismatch(f"item {key}: unexpected attribute {extra[0]}\n  expected {want}\n  got {got}")
        self.subset(want, got, f"item {key}: ")

    def expect_keys(self, step: Dict[str, Any]) -> None:
        keys: List[str] = []
        for page in self.ddb.get_paginator("scan").paginate(TableName=self.table_name, ConsistentRead=True):
            keys += [i[self.id_attr]["S"] for i in page["Items"]]
        want = sorted(text(k) for k in step["keys"])
        if sorted(keys) != want:
            raise Mismatch(f"stored keys {sorted(keys)}, expected {want}")

    # -- expectations -----------------------------------------------------------------------

    def step(self, step: Dict[str, Any]) -> None:
        op = step["op"]
        raw = {"put_raw": self.put_raw, "age": self.age, "expect_item": self.expect_item, "expect_keys": self.expect_keys}
        if op in raw:
            return raw[op](step)
        if op == "snapshot":
            self.vars[step["as"]] = self.read_raw(self.raw_key(step))
            return
        failed = False
        try:
            got = self.contend(step) if op == "contend" else self.call(step)
        except leaselock.LeaseLockError as e:
            got, failed = error_value(e), True
        if "expect" not in step:
            if failed:
                raise Mismatch(f"expected success, got {got}")
            return
        want = step["expect"]
        if want is None:
            if got is not None:
                raise Mismatch(f"expected null, got {got}")
            return
        if failed != ("error" in want):
            raise Mismatch(f"expected {want}, got {got}")
        self.subset(want, got, "")

    def subset(self, want: Dict[str, Any], got: Any, where: str) -> None:
        if not isinstance(got, dict):
            raise Mismatch(f"{where}expected {want}, got {got}")
        for k, wv in want.items():
            why = self.mismatch(wv, got.get(k))
            if why:
                raise Mismatch(f"{where}{k}: {why}\n  expected {want}\n  got {got}")

    def mismatch(self, want: Any, got: Any) -> Optional[str]:
        """Why ``got`` does not match the expected value (a literal or a matcher), or None."""
        if isinstance(want, dict):
            if "ms_from_now" in want:
                lo, hi = want["ms_from_now"]
                now = now_ms()
                if not isinstance(got, int) or not now + lo <= got <= now + hi:
                    return f"{got} is {got - now if isinstance(got, int) else '?'} ms from now, expected {lo}..={hi}"
                return None
            if "any" in want:
                return "absent" if got is None else None
            if "one_of" in want:
                return None if got in want["one_of"] else f"{got} is not one of {want['one_of']}"
            if "unordered" in want:
                ok = isinstance(got, list) and sorted(map(json.dumps, got)) == sorted(map(json.dumps, want["unordered"]))
                return None if ok else f"{got} is not {want['unordered']} in any order"
            if "var" in want:
                name, field = want["var"].split(".", 1)
                value = self.vars[name][field]
                return None if value == got else f"{got} is not {want['var']} ({value})"
            if not isinstance(got, dict) or set(got) != set(want):
                return f"{got} has other keys than {want}"
            for k, wv in want.items():
                why = self.mismatch(wv, got.get(k))
                if why:
                    return f"{k}: {why}"
            return None
        if isinstance(want, list):
            if not isinstance(got, list) or len(got) != len(want):
                return f"{got} is not {want}"
            for wv, gv in zip(want, got):
                why = self.mismatch(wv, gv)
                if why:
                    return why
            return None
        same = want == got and isinstance(want, bool) == isinstance(got, bool)
        return None if same else f"{got!r} is not {want!r}"


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s["name"] for s in SCENARIOS])
def test_conformance(scenario: Dict[str, Any]) -> None:
    run = Run(scenario)
    for n, step in enumerate(scenario["steps"], 1):
        try:
            run.step(step)
        except Mismatch as e:
            raise Mismatch(f"step {n} ({step['op']}): {e}\n  step: {json.dumps(step)}") from None
