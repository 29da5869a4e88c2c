#!/usr/bin/env python3
"""Writes bench/REPORT.md and its plots (bench/*.png) from bench/results/latest.json and
bench/results/failover.json, the files `make bench` fills. Every figure is printed beside its
anchor: the AWS reference design's numbers, the targets set for this project, a seed's figure.

usage: report.py   (run by `make bench`, after every section)
"""

from __future__ import annotations

import json
import os
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, List

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results" / "latest.json"
FAILOVER = BENCH / "results" / "failover.json"

# The AWS post's own figures (its reference worker: 20 s lease, 5 s renew, a reconciler run on a
# schedule) and the price its cost figure implies.
AWS_CRASH_WORST_S = 80
AWS_WRITES_PER_CONNECTION_HOUR = 720
AWS_UNITS_PER_RENEWAL = 3
AWS_MONTHLY_2000 = 1300
PRICE_PER_MILLION_WRITES = 1.25  # USD, the post's price (before Nov 2024): 2,000 x 720 x 730 h x this = $1,314
# On-demand write request units in us-east-1 since AWS halved on-demand prices on 1 November 2024
# (the DynamoDB pricing page, read 2026-12): what a month costs today.
PRICE_PER_MILLION_WRITES_NOW = 0.625
HOURS_PER_MONTH = 730
# The seed's election figures (bluetape4k-leader: DynamoDB Local; Redis with Lettuce).
SEED_DYNAMODB_OPS = 641
SEED_REDIS_OPS = 1456


def fmt(v: Any, digits: int = 0) -> str:
    if v is None:
        return "not measured"
    if isinstance(v, (int, float)):
        return f"{v:,.{digits}f}"
    return str(v)


def machine() -> str:
    cores = os.cpu_count()
    model = ""
    try:
        model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return f"{cores} cores ({model or platform.processor()}), {platform.system()} {platform.release()}; load average {load:.1f} when the report was written"


def bench_commit(results: Dict[str, Any]) -> str:
    """The commit the figures were measured on, as `make bench` recorded it when it started (not
    the checkout the report is written in), and whether the tree had uncommitted changes."""
    commit = results.get("bench_commit")
    if not commit:
        return "unknown: not recorded by a full `make bench`"
    return commit if results.get("bench_tree_clean", False) else f"{commit}, with uncommitted changes"


def plot_failover(failover: Dict[str, Any], r: Dict[str, Any]) -> None:
    crash, graceful, k = failover["crash"], failover["graceful"], failover["crash_scale"]
    scaled_s = [s * k / 1000 for s in crash["samples_ms"]]
    session = failover.get("session_crash")
    fig, axes = plt.subplots(1, 3 if session else 2, figsize=(16 if session else 11, 4))
    a, b = axes[0], axes[1]
    a.hist(scaled_s, bins=30, color="#3b7dd8")
    bound = (20_000 + 1_000 + 2_000) / 1000
    a.axvline(AWS_CRASH_WORST_S, color="#c0392b", linestyle="--", label=f"AWS reference design, worst ~{AWS_CRASH_WORST_S} s")
    a.axvline(24, color="#7f8c8d", linestyle=":", label="target: lease + skew + 3 s = 24 s")
    a.axvline(bound, color="#27ae60", linestyle="-.", label=f"lease + skew + orphan interval = {bound:g} s")
    a.set_xlim(0, AWS_CRASH_WORST_S + 5)
    a.set_xlabel("crash failover at a 20 s lease, s (measured at a %g s lease, x%g)" % (crash["lease_ms"] / 1000, k))
    a.set_ylabel("streams")
    a.set_title(f"SIGKILL: {crash['failures']} crashes, {len(scaled_s)} streams")
    a.legend(fontsize=7, loc="upper center")
    b.hist(graceful["samples_ms"], bins=30, color="#8e44ad")
    b.axvline(2000, color="#7f8c8d", linestyle=":", label="target: 2 s")
    b.set_xlim(0, max(2100, max(graceful["samples_ms"]) * 1.1))
    b.set_xlabel("graceful hand-over at the defaults (20 s lease), ms, unscaled")
    b.set_title(f"SIGTERM: {graceful['failures']} hand-overs, {len(graceful['samples_ms'])} streams")
    b.legend(fontsize=7)
    if session:
        c = axes[2]
        c.hist([v / 1000 for v in session["samples_ms"]], bins=30, color="#16a085")
        c.axvline(6, color="#7f8c8d", linestyle=":", label="target p99: 6 s")
        lease, skew = session["lease_ms"] / 1000, session["clock_skew_ms"] / 1000
        low = lease - session["renew_ms"] / 1000 + skew
        c.axvline(low, color="#27ae60", linestyle="-.", label=f"lease - renew + skew = {low:g} s")
        c.set_xlim(0, max(8, max(session["samples_ms"]) / 1000 * 1.1))
        c.set_xlabel(f"session-mode crash failover at a {lease:g} s session lease, s, unscaled")
        c.set_title(f"SIGKILL, session mode: {session['failures']} crashes, {len(session['samples_ms'])} streams")
        c.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(BENCH / "failover.png", dpi=110)
    plt.close(fig)


def plot_cpu(r: Dict[str, Any]) -> None:
    bars = [
        ("Rust\nLeaseTable", r.get("rust_cpu_us_per_renew"), "#d35400"),
        ("Python\nleaselock", r.get("python_cpu_us_per_renew"), "#2980b9"),
        ("Python\nasyncio", r.get("python_async_cpu_us_per_renew"), "#5dade2"),
        ("boto3\n(same UpdateItem)", r.get("boto3_cpu_us_per_renew"), "#7f8c8d"),
        ("Node\nleaselock", r.get("node_cpu_us_per_renew"), "#27ae60"),
        ("JS SDK v3\n(same UpdateItem)", r.get("jssdk_cpu_us_per_renew"), "#95a5a6"),
    ]
    bars = [b for b in bars if b[1] is not None]
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.bar([b[0] for b in bars], [b[1] for b in bars], color=[b[2] for b in bars])
    for i, (_, v, _) in enumerate(bars):
        ax.text(i, v, f"{v:.0f}", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("client CPU per renew, us (user + system)")
    ax.set_title("Client CPU per renew, one run, keep-alive loopback endpoint with canned answers")
    ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    fig.savefig(BENCH / "cpu.png", dpi=110)
    plt.close(fig)


def plot_writes(r: Dict[str, Any]) -> None:
    groups = ["writes", "write units\n(table + index)", "requests\n(all kinds)"]
    per_item = [r.get("writes_per_connection_hour"), r.get("write_units_per_connection_hour"), r.get("requests_per_connection_hour")]
    session = [r.get("session_writes_per_connection_hour"), r.get("session_write_units_per_connection_hour"), r.get("session_requests_per_connection_hour")]
    aws = [AWS_WRITES_PER_CONNECTION_HOUR, AWS_WRITES_PER_CONNECTION_HOUR * AWS_UNITS_PER_RENEWAL, None]
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.27
    for offset, (label, values, color) in enumerate(
        [("AWS post (reference worker)", aws, "#c0392b"), ("leaselock per-item", per_item, "#2980b9"), ("leaselock session", session, "#27ae60")]
    ):
        xs = [i + (offset - 1) * width for i in range(len(groups))]
        vals = [v or 0 for v in values]
        ax.bar(xs, vals, width, label=label, color=color)
        for x, v in zip(xs, values):
            if v:
                ax.text(x, v, f"{v:,.0f}" if v >= 100 else f"{v:.1f}", ha="center", va="bottom", fontsize=7)
    ax.set_yscale("log")
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups)
    ax.set_ylabel("per connection-hour (log scale)")
    setup = r.get("write_cost_setup", {})
    ax.set_title(f"DynamoDB cost per connection-hour: {setup.get('connections', '?')} connections, {setup.get('workers_per_mode', '?')} workers per mode, counted from requests sent")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(BENCH / "writes.png", dpi=110)
    plt.close(fig)


def ratio(a: Any, b: Any) -> str:
    return f"{a / b:.2f}x" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else "n/a"


def report(r: Dict[str, Any], failover: Dict[str, Any] | None) -> str:
    g = r.get
    setup = g("write_cost_setup", {})
    fo = g("failover_setup", {})
    crash_setup = fo.get("crash", {})
    grace_setup = fo.get("graceful", {})
    k = g("crash_failover_scale")
    duration = g("bench_duration_s")
    lines: List[str] = []
    w = lines.append
    w("# leaselock benchmark report")
    w("")
    w(f"Written by `bench/report.py`, the last step of `make bench`, from one full run on commit `{bench_commit(r)}` ({datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}).")
    w(f"Machine: {machine()}. It is shared with other builds and noisy: absolute CPU figures move from")
    w("run to run, so every comparison below is measured side by side in the same run, and the ratios are")
    w("the figures to read. All DynamoDB traffic goes to the local engine (moto over HTTP) on loopback.")
    if duration:
        w(f"This run of `make bench` took {duration / 60:.1f} minutes end to end (builds included).")
    if g("bench_run_note"):
        w("")
        w(f"**How this run was made:** {g('bench_run_note')}")
        w("")
    w("Raw figures: `bench/results/latest.json`; every failover sample: `bench/results/failover.json`.")
    w("")
    w("## Headline figures")
    w("")
    w("| figure | leaselock | anchor |")
    w("|---|---|---|")
    w(f"| crash failover (SIGKILL), worst, 20 s lease | {fmt(g('crash_failover_ms_max', 0) / 1000, 1)} s (p50 {fmt(g('crash_failover_ms_p50', 0) / 1000, 1)} s), scaled x{fmt(k, 0)} from a {fmt(crash_setup.get('lease_ms', 0) / 1000, 0)} s lease | AWS reference design: ~{AWS_CRASH_WORST_S} s; target lease + skew + 3 s = 24 s |")
    if g("session_crash_failover_ms_p99") is not None:
        w(f"| crash failover (SIGKILL), session mode, 5 s session lease, p99 | {fmt(g('session_crash_failover_ms_p99') / 1000, 2)} s (p50 {fmt(g('session_crash_failover_ms_p50') / 1000, 2)} s, max {fmt(g('session_crash_failover_ms_max') / 1000, 2)} s), unscaled | target <= 6 s |")
        w(f"| writes per connection-hour at that setting (100 connections per worker) | {fmt(g('session_failover_writes_per_connection_hour'), 1)} (per-item at the defaults: {fmt(g('crash_failover_writes_per_connection_hour'), 0)}) | target <= 30 |")
    w(f"| graceful hand-over (SIGTERM), worst | {fmt(g('graceful_handover_ms_max'))} ms (p50 {fmt(g('graceful_handover_ms_p50'))} ms), at the defaults | target 2 s |")
    w(f"| writes per connection-hour, per-item | {fmt(g('writes_per_connection_hour'), 1)} | AWS post: {AWS_WRITES_PER_CONNECTION_HOUR} |")
    w(f"| write units per connection-hour, per-item (incl. index) | {fmt(g('write_units_per_connection_hour'), 0)} | AWS post: ~{AWS_UNITS_PER_RENEWAL} per renewal = {AWS_WRITES_PER_CONNECTION_HOUR * AWS_UNITS_PER_RENEWAL:,} |")
    w(f"| writes per connection-hour, session mode | {fmt(g('session_writes_per_connection_hour'), 2)} | target <= 10 |")
    w(f"| write units per connection-hour, session mode | {fmt(g('session_write_units_per_connection_hour'), 2)} | {ratio(g('write_units_per_connection_hour'), g('session_write_units_per_connection_hour'))} fewer than per-item |")
    w(f"| orphan query read units per worker-hour (2 s interval) | {fmt(g('orphan_query_read_units_per_hour'), 0)} | 0.5 per empty query x 1,800 = 900 |")
    w(f"| client CPU per renew: Python / Rust | {ratio(g('python_cpu_us_per_renew'), g('rust_cpu_us_per_renew'))} | target <= 1.25x |")
    w(f"| client CPU per renew: boto3 / Python | {ratio(g('boto3_cpu_us_per_renew'), g('python_cpu_us_per_renew'))} | target >= 4x |")
    w(f"| client CPU per renew: Python asyncio / Rust, boto3 / Python asyncio | {ratio(g('python_async_cpu_us_per_renew'), g('rust_cpu_us_per_renew'))}, {ratio(g('boto3_cpu_us_per_renew'), g('python_async_cpu_us_per_renew'))} | targets <= 1.25x, >= 4x |")
    w(f"| client CPU per renew: Node / JS SDK | {ratio(g('node_cpu_us_per_renew'), g('jssdk_cpu_us_per_renew'))} | target <= 1.3x |")
    w(f"| Node package's wasm | {fmt(g('wasm_bytes'))} bytes ({fmt(g('wasm_gzip_bytes'))} gzipped), loads in {fmt(g('wasm_load_ms'), 1)} ms | limit {fmt(g('wasm_limit_bytes'))} bytes |")
    w(f"| client CPU per renew, Rust, on the store's clock / on the local clock (side by side; in process) | {fmt(g('rust_renew_store_clock_cpu_ratio'), 3)}x ({fmt(g('rust_cpu_us_per_renew_store_clock'))} / {fmt(g('rust_cpu_us_per_renew_local_clock'))} us); {fmt(g('rust_renew_store_clock_cpu_ratio_in_process'), 3)}x | target <= 1.05x |")
    w(f"| election `run_if_leader`, DynamoDB API | {fmt(g('election_dynamodb_ops_per_s'))} ops/s | seed (bluetape4k, DynamoDB Local): {SEED_DYNAMODB_OPS} |")
    w(f"| election `run_if_leader`, Redis | {fmt(g('election_redis_ops_per_s'))} ops/s | seed (bluetape4k, Lettuce): {SEED_REDIS_OPS:,} |")
    w("")

    w("## Failover")
    w("")
    w("![failover distributions](failover.png)")
    w("")
    w("Method (`bench/failover.sh`, `cli/src/failover.rs`): a fleet of "
      f"{fmt(crash_setup.get('workers'))} reference-worker processes (`leaselock worker`, each streaming its "
      f"connections from a local feed with fenced writes) holds {fmt(crash_setup.get('connections'))} streams. "
      "Each round picks the worker holding the most streams and sends it SIGKILL (crash) or SIGTERM "
      "(graceful: it releases its leases and hints them on the SQS queue), then measures, per stream it "
      "held, the time from the signal to another worker's claim, read from the claim itself (a claim "
      "writes `lease_expires_at_ms = now + lease`, so expiry minus lease is the claim instant; all "
      "processes share the machine's clock), and starts a replacement worker. A random pause of up to "
      "one renew interval before each crash spreads the crashes over the victim's renewal schedule. A stream "
      "another worker had claimed before the signal (the victim had already lost it, e.g. a renewal past its "
      "deadline on the loaded engine) is no sample: "
      f"{crash_setup.get('moved_before_signal', 0)} crash and {grace_setup.get('moved_before_signal', 0)} hand-over streams were left out so.")
    w("")
    if crash_setup:
        w(f"- Crash: {crash_setup.get('failures')} SIGKILLs, {crash_setup.get('samples')} stream samples, measured at lease "
          f"{crash_setup.get('lease_ms')} ms, renew {crash_setup.get('renew_ms')} ms, skew {crash_setup.get('clock_skew_ms')} ms, "
          f"orphan query every {crash_setup.get('orphan_interval_ms')} ms: every timing knob of the defaults "
          f"(20,000 / 5,000 / 1,000 / 2,000 ms) divided by k = {fmt(k)}. **The crash figures are scaled**: a crash "
          "failover is the wait for the lease to expire past the skew plus at most one orphan query interval plus "
          "the claim, i.e. a sum of those knobs plus latencies, so the figure at the 20 s lease is "
          f"`measured x k` (k = 20,000 ms / {crash_setup.get('lease_ms')} ms). The scaling multiplies the request "
          "and process latencies by k as well, so it errs high. Measured unscaled: "
          f"p50 {fmt(g('crash_failover_measured_ms_p50'))} ms, max {fmt(g('crash_failover_measured_ms_max'))} ms. "
          f"Machine load average (1 min) at the first and last round: {crash_setup.get('load_average')}.")
        w(f"- Scaled to the 20 s lease: p50 {fmt(g('crash_failover_ms_p50'))} ms, p99 {fmt(g('crash_failover_ms_p99'))} ms, "
          f"max {fmt(g('crash_failover_ms_max'))} ms. Expected window at the defaults: from lease - renew + skew = 16 s "
          "(crash just before a renewal) to lease + skew + orphan interval = 23 s plus the claim. The AWS "
          f"reference design's worst case is ~{AWS_CRASH_WORST_S} s at the same 20 s lease: its orphans wait for the "
          "next scheduled reconciler run; here every worker with room queries the sparse orphan index every 2 s.")
    if grace_setup:
        w(f"- Graceful: {grace_setup.get('failures')} SIGTERMs, {grace_setup.get('samples')} stream samples, at the defaults "
          f"(lease {grace_setup.get('lease_ms')} ms, orphan query every {grace_setup.get('orphan_interval_ms')} ms), "
          f"**not scaled**: p50 {fmt(g('graceful_handover_ms_p50'))} ms, p99 {fmt(g('graceful_handover_ms_p99'))} ms, "
          f"max {fmt(g('graceful_handover_ms_max'))} ms; the stopped worker exited at most {fmt(g('sigterm_exit_ms_max'))} ms "
          "after SIGTERM.")
    w("")
    session_setup = fo.get("session")
    if session_setup:
        w(session_section(r, session_setup, crash_setup))

    w("## Client CPU per operation")
    w("")
    w("![client CPU per renew](cpu.png)")
    w("")
    w("| client | renew, us CPU | acquire, us CPU |")
    w("|---|---|---|")
    for name, key in [("Rust `LeaseTable`", "rust"), ("Python `leaselock` (sync)", "python"), ("Python `leaselock` (asyncio)", "python_async"), ("boto3, the same UpdateItem", "boto3")]:
        w(f"| {name} | {fmt(g(key + '_cpu_us_per_renew'), 1)} | {fmt(g(key + '_cpu_us_per_acquire'), 1)} |")
    w(f"| Node `leaselock` (wasm + JS SDK) | {fmt(g('node_cpu_us_per_renew'), 1)} | |")
    w(f"| JS SDK v3, the same UpdateItem | {fmt(g('jssdk_cpu_us_per_renew'), 1)} | |")
    w("")
    ratios = []
    for key, name in (("python", "Python"), ("python_async", "Python asyncio")):
        for op in ("renew", "acquire"):
            us = g(f"{key}_cpu_us_per_{op}")
            ratios.append(f"{name} {op}: {ratio(us, g(f'rust_cpu_us_per_{op}'))} Rust, {ratio(g(f'boto3_cpu_us_per_{op}'), us)} less than boto3")
    pinned = ("The same hand-offs with the process on one CPU, so that no wake-up crosses CPUs: "
              f"{fmt(g('python_thread_handoff_pinned_cpu_us'), 1)} us and {fmt(g('python_asyncio_handoff_pinned_cpu_us'), 1)} us. "
              "Every leaselock call makes one such round trip (the caller wakes the runtime thread, which wakes it back), "
              "a boto3 call none (its own thread does the I/O), so the difference is a cost of this machine's "
              "cross-CPU wake-ups that the leaselock figures carry and boto3's do not. "
              if g('python_thread_handoff_pinned_cpu_us') is not None else "")
    w("Ratios (the figures to read on this machine; targets <= 1.25x Rust and >= 4x less than boto3): " + "; ".join(ratios) + ". "
      f"Node / JS SDK {ratio(g('node_cpu_us_per_renew'), g('jssdk_cpu_us_per_renew'))} (target <= 1.3x). "
      "Python asyncio with 16 leases renewing at once on one loop: "
      f"{fmt(g('python_async_cpu_us_per_renew_16_concurrent'), 1)} us per renew (a burst of completions shares one wake-up of the loop). "
      f"Python's own cost of waiting for work done on another thread, measured in the same rounds with no leaselock in it: "
      f"{fmt(g('python_thread_handoff_cpu_us'), 1)} us blocking, {fmt(g('python_asyncio_handoff_cpu_us'), 1)} us through the event loop; "
      "their difference is part of what every asyncio call costs beyond a blocking one, whatever the client. "
      + pinned
      + f"Node's protocol alone (an in-memory client): {fmt(g('node_protocol_cpu_us_per_renew'), 1)} us.")
    w("")
    w("Method: process CPU (user + system: `getrusage`, `time.process_time()`, `process.cpuUsage()`), not wall "
      "time, of a loop of renewals against a loopback HTTP/1.1 keep-alive server answering canned DynamoDB "
      "responses in a process of its own (its CPU is not counted): the local engine closes every connection, "
      "real clients keep them alive. Python and Rust: `scripts/bench-python.sh` (bindings/python/bench/cpu.py, "
      f"bench/cpu; {g('python_cpu_method', 'one round')}; the Python binding's runtime has "
      f"{fmt(g('python_runtime_threads', 2))} worker thread(s), the Rust client runs under `#[tokio::main]`'s default "
      "multi-thread runtime); Node: `bindings/wasm/bench/renew.js` (medians of rounds, leaselock and the SDK interleaved). "
      "Release builds.")
    w("")
    w(wasm_section(r))

    w("## DynamoDB requests and units per connection-hour")
    w("")
    w("![writes per connection-hour](writes.png)")
    w("")
    pi, se = setup.get("per_item", {}), setup.get("session", {})
    w("| per connection-hour | per-item | session | AWS post |")
    w("|---|---|---|---|")
    w(f"| writes | {fmt(g('writes_per_connection_hour'), 1)} | {fmt(g('session_writes_per_connection_hour'), 2)} | {AWS_WRITES_PER_CONNECTION_HOUR} |")
    w(f"| write units (table + index) | {fmt(g('write_units_per_connection_hour'), 1)} | {fmt(g('session_write_units_per_connection_hour'), 2)} | ~{AWS_WRITES_PER_CONNECTION_HOUR * AWS_UNITS_PER_RENEWAL:,} |")
    w(f"| requests (every kind) | {fmt(g('requests_per_connection_hour'), 1)} | {fmt(g('session_requests_per_connection_hour'), 2)} | |")
    w("")
    w(f"Counted over {fmt(setup.get('held_s'), 0)} s of holding (claims excluded) with {fmt(setup.get('connections'))} "
      f"connections per mode, {fmt(setup.get('workers_per_mode'))} workers per mode, both fleets at once, default "
      "timing (lease 20 s, renew 5 s, orphan query 2 s). Requests in the window, per-item: "
      f"`{json.dumps(pi.get('requests', {}))}`; session: `{json.dumps(se.get('requests', {}))}`; "
      f"write units per-item {fmt(pi.get('table_write_units'))} table + {fmt(pi.get('index_write_units'))} index, "
      f"session {fmt(se.get('table_write_units'))} table + {fmt(se.get('index_write_units'))} index.")
    w("")
    w("Method (`core/benches/write_cost.rs`): every request attempt the workers' SDK clients transmit passes through "
      "an SDK interceptor that reads it (and a query's answer) and prices it by DynamoDB's billing rules: 1 write unit "
      "per item write up to 1 KB (the largest item here is "
      f"{fmt(setup.get('largest_item_bytes'))} bytes), 2 inside a transaction; an index is written when a write touches it: "
      "a change of its key attributes is a delete and an insert (2 units), of a projected attribute 1 unit. A renewal "
      "moves the orphan index's sort key (`lease_expires_at_ms`), so it costs 3 units in per-item mode, as the AWS post "
      "says; in session mode only the worker's session item is renewed (it sits in the same sparse index), so 3 units "
      "per worker per renew interval, whatever the worker holds. The writes are also counted by each `LeaseTable`'s own "
      "request counter (the `writes_per_connection_hour` keys), and the two agree "
      f"({fmt(pi.get('writes_counted_by_table'))} / {fmt(pi.get('requests', {}).get('UpdateItem'))} UpdateItem in per-item mode). "
      "Session mode's figure per connection-hour is 720 / connections per worker (here "
      f"{fmt((setup.get('connections') or 0) / (setup.get('workers_per_mode') or 1), 0)}).")
    w("")
    per_item_units = g("write_units_per_connection_hour") or 0
    session_units = g("session_write_units_per_connection_hour") or 0
    w(f"At the AWS post's scale (2,000 connections, its price of ${PRICE_PER_MILLION_WRITES} per million write request units, which is how "
      f"its ~${AWS_MONTHLY_2000:,} a month for writes alone comes out: 2,000 x 720 x {HOURS_PER_MONTH} h): per-item with the index writes "
      f"{2000 * per_item_units / 3600:,.0f} write units/s, ${2000 * per_item_units * HOURS_PER_MONTH * PRICE_PER_MILLION_WRITES / 1e6:,.0f} a month; "
      f"session mode at this run's connections per worker {2000 * session_units / 3600:,.1f} write units/s, "
      f"${2000 * session_units * HOURS_PER_MONTH * PRICE_PER_MILLION_WRITES / 1e6:,.0f} a month. "
      f"At today's on-demand price (${PRICE_PER_MILLION_WRITES_NOW} per million write request units in us-east-1 since "
      "AWS halved on-demand prices on 1 November 2024): per-item "
      f"${2000 * per_item_units * HOURS_PER_MONTH * PRICE_PER_MILLION_WRITES_NOW / 1e6:,.0f} a month, session mode "
      f"${2000 * session_units * HOURS_PER_MONTH * PRICE_PER_MILLION_WRITES_NOW / 1e6:,.0f} a month.")
    w("")

    w("## Orphan reconciliation")
    w("")
    w(f"Read units per worker-hour at the default 2 s orphan query interval: **{fmt(g('orphan_query_read_units_per_hour'), 0)}** "
      f"(session mode: {fmt(g('session_orphan_query_read_units_per_hour'), 0)}; anchor: DESIGN.md's 0.5 units per empty "
      "query, 1,800 queries an hour = 900). Method: measured from what the queries actually read, in the same window as "
      "above: the local engine does not report consumed capacity (moto answers a fixed figure), so the interceptor "
      "sizes the items each orphan index query returned (DynamoDB's item size: names plus values), rounds the total up "
      "to 4 KB and bills 0.5 units per 4 KB (index queries are eventually consistent), 0.5 at least; the mean per query "
      "times 1,800 queries an hour. Only a worker with room queries (a full worker claims nothing): "
      f"{fmt(setup.get('per_item', {}).get('orphan_queries'))} orphan queries were sent in the window.")
    w("")

    w(fleet_section(g("fleet_sim")))
    w(fleet_point_section(g("fleet_point")))
    w(explore_section(g("explore")))
    w("## Election throughput")
    w("")
    w("| `run_if_leader`, trivial action (claim + release) | leaselock | seed (bluetape4k-leader) |")
    w("|---|---|---|")
    w(f"| DynamoDB API (local engine: moto), 1 name | {fmt(g('election_dynamodb_ops_per_s'))} ops/s | {SEED_DYNAMODB_OPS} ops/s (DynamoDB Local) |")
    w(f"| Redis (local), 1 name | {fmt(g('election_redis_ops_per_s'))} ops/s | {SEED_REDIS_OPS:,} ops/s (Lettuce) |")
    w(f"| DynamoDB API, 8 names at once | {fmt(g('election_dynamodb_ops_per_s_8_names'))} ops/s | |")
    w(f"| Redis, 8 names at once | {fmt(g('election_redis_ops_per_s_8_names'))} ops/s | |")
    w("")
    w("Method: `core/tests/election_bench.rs` (run by `make bench` with `--ignored`): one elector calls `run_if_leader` "
      "in a loop for 5 s per figure. The seed's figures are its own, on other hardware and against DynamoDB Local, "
      "not moto: read them as orders of magnitude, not a race.")
    w("")
    w("## Reproduce")
    w("")
    w("`make bench` (from a fresh clone: it installs what it needs, starts local engines of its own on loopback and")
    w("stops them). Sections: `make bench-python`, `make bench-node`, `make bench-wasm`, `lambdas/bench.sh` (reconciler over 10,000")
    w("orphans, `bench-results/reconciler.txt`), the election bench, `core/bench.sh` (write cost), `bench/failover.sh`;")
    w("each merges its keys into `bench/results/latest.json` through `bench/merge.py`, then `bench/report.py` writes")
    w("this file and the plots.")
    w("")
    return "\n".join(lines)


README = BENCH.parent / "README.md"
README_START = "<!-- headline figures: written by bench/report.py from bench/results/latest.json -->"
README_END = "<!-- end of headline figures -->"


PLACES = ["table (work items)", "table (session items)", "orphan index", "owner index",
          "orphan index (reads)", "owner index (reads)"]


def wasm_section(r: Dict[str, Any]) -> str:
    """The Node package's .wasm: size, gzipped size, its limit and load time (bindings/wasm/bench/size.js)."""
    g = r.get
    if g("wasm_bytes") is None:
        return ""
    size, limit = g("wasm_bytes"), g("wasm_limit_bytes")
    within = "within it" if isinstance(limit, int) and size <= limit else "**over it**"
    return "\n".join([
        "## Node package: the wasm",
        "",
        "| `bindings/wasm/pkg/leaselock_wasm_bg.wasm` | |",
        "|---|---|",
        f"| size | {fmt(size)} bytes |",
        f"| gzipped (level 9) | {fmt(g('wasm_gzip_bytes'))} bytes |",
        f"| limit | {fmt(limit)} bytes: {within} |",
        f"| compiled and instantiated by Node, median of {fmt(g('wasm_loads'))} loads | {fmt(g('wasm_load_ms'), 1)} ms |",
        "",
        "Method (`make bench-wasm`: `bindings/wasm/bench/size.js`): the release build of `scripts/build-wasm.sh` "
        "(opt-level \"s\", LTO, one codegen unit, panic=abort, then `wasm-opt -O3`). Each load is a fresh Node "
        "process that compiles the module and instantiates it (a process keeps a module it compiled, so a second "
        "load in one would be cached). The section fails when the wasm is larger than its limit (set in size.js, "
        "with the sizes it was chosen from).",
        "",
    ])


def fleet_section(fs: Dict[str, Any] | None) -> str:
    """The fleet simulation (core/examples/fleet_sim.rs): peak units per partition value."""
    if not fs:
        return ""
    lines: List[str] = []
    w = lines.append
    modes = fs["modes"]
    w("## Fleet simulation: capacity units per partition value")
    w("")
    w(f"{fs['connections']:,} connections on {fs['workers']} workers of {fs['max_connections']}, every worker an engine "
      "(`leaselock::engine`) on the memory store and a manual clock (`leaselock::engine::sim`, run by "
      "`core/examples/fleet_sim.rs`): a cold start (every worker at once, all the work orphaned), a steady minute, "
      "the crash of one worker and a rolling deploy (workers shut down and replaced one at a time). Each store "
      "operation is billed to the partition values it touches as DynamoDB bills them (items under 1 KB: one write "
      "unit per item written, two for an index entry whose key moves, twice that in a transaction; reads 4 KB per "
      "unit, halved). The figures are the peak units in one second of the hottest partition value of each place; "
      "DynamoDB serves about 1,000 write and 3,000 read units per second per partition value, and the simulation "
      "throttles as it does (no burst: a request that would take any partition value it touches, table or index, "
      "past that in one second is answered throttled and not applied, and the driver retries it with the "
      "protocol's backoff within the operation's budget). Handlers do not checkpoint here: "
      "each checkpoint adds one table write and one orphan-index write on `STARTED` in both modes. "
      "A mode named with shards runs per-item mode with the orphan index sharded "
      "(`TableConfig::orphan_shards`: running work over `STARTED#0..N-1`, orphan queries reading every shard); "
      "session mode runs sharded too (the row of shards below): every claim moves its item's index sort key "
      "(2 units), so one `STARTED` value cold-starts at most 500 connections a second. "
      "Per-partition figures are the hottest shard's, and a connection count per partition is that "
      "shard's share of the work.")
    w("")
    names = list(modes)
    w("| | " + " | ".join(f"{n} (lease {modes[n]['lease_ms'] / 1000:g} s, renew {modes[n]['renew_ms'] / 1000:g} s)" for n in names) + " |")
    w("|---|" + "---|" * len(names))
    def row(label: str, f) -> None:
        cells = []
        for n in names:
            try:
                cells.append(f(modes[n]))
            except (KeyError, TypeError):
                cells.append("")
        w(f"| {label} | " + " | ".join(cells) + " |")
    row("orphan-index shards (`orphan_shards`)", lambda m: fmt(m["orphan_shards"]))
    row("writes per connection-hour (steady)", lambda m: fmt(m["phases"]["steady"]["writes_per_connection_hour"], 1))
    for phase in ["cold_start", "steady", "crash", "rolling_deploy"]:
        for place in PLACES:
            row(f"{phase.replace('_', ' ')}: peak {place}, units/s",
                lambda m, phase=phase, place=place: fmt(m["phases"][phase]["peaks"][place]["units_per_s"], 1)
                + f" (`{m['phases'][phase]['peaks'][place]['partition'][:24]}`)")
    for phase in ["cold_start", "steady", "crash", "rolling_deploy"]:
        row(f"{phase.replace('_', ' ')}: requests answered throttled",
            lambda m, phase=phase: fmt(m["phases"][phase]["throttled"]["requests"]))
    def held_after(p: Dict[str, Any]) -> str:
        if p["all_held_after_ms"] is None:
            return f"not within {fmt(p.get('limit_ms'))} ms"
        return f"{fmt(p['all_held_after_ms'])} ms"
    row("cold start: all held after", lambda m: held_after(m["phases"]["cold_start"]))
    row("cold start: held once at its end (of all)",
        lambda m: f"{fmt(m['phases']['cold_start']['held_at_end'])} of {fmt(fs['connections'])}")
    row("crash: connections of the crashed worker", lambda m: fmt(m["phases"]["crash"]["connections"]))
    row("crash: all held again after", lambda m: held_after(m["phases"]["crash"]))
    row("rolling deploy: workers replaced", lambda m: fmt(m["phases"]["rolling_deploy"]["workers_replaced"]))
    def gap(ms: Any) -> str:
        # A worker's work not all held again within the deploy step's 60 s is recorded as u64::MAX.
        return "not within 60 s" if ms is None or ms >= 2**63 else f"{fmt(ms)} ms"
    row("rolling deploy: hand-over p50 / p99 / max",
        lambda m: " / ".join(gap(m["phases"]["rolling_deploy"]["hand_over_ms"][q]) for q in ["p50", "p99", "max"]))
    def carried(m: Dict[str, Any], key: str) -> str:
        # A steady minute that was throttled peaks at the limit: the figure would overstate it.
        if m["phases"]["steady"]["throttled"]["requests"] > 0:
            return "(steady state throttled)"
        return fmt(m["phases"]["steady"][key])
    row("connections one orphan-index partition carries at 1,000 WCU/s (steady peak)",
        lambda m: carried(m, "connections_within_1000_wcu"))
    row("connections the table carries at 1,000 WCU/s per orphan-index partition (all shards)",
        lambda m: carried(m, "table_connections_within_1000_wcu"))
    row("simulated / wall time", lambda m: f"{fmt(m['simulated_s'])} s / {fmt(m['run_s'], 1)} s")
    w("")
    return "\n".join(lines) + "\n"


def fleet_point_section(fp: Dict[str, Any] | None) -> str:
    """One point of the simulation's curve run by real processes (bench/fleet_point.sh)."""
    if not fp:
        return ""
    s, real, sim = fp["settings"], fp["real"], fp["sim"]
    lines: List[str] = []
    w = lines.append
    w("## Real processes beside the simulation")
    w("")
    w(f"The simulation above, checked at one point of its curve by real worker processes (`bench/fleet_point.sh`): "
      f"session mode at a {fmt(s['lease_ms'] / 1000, 0)} s session lease (renew {fmt(s['renew_ms'])} ms, skew "
      f"{fmt(s['skew_ms'])} ms, orphan query every {fmt(s['orphan_interval_ms'])} ms), {s['connections']:,} streams on "
      f"{s['workers']} `leaselock worker` processes of {s['max_connections']}, the orphan index on {s['orphan_shards']} "
      f"shards. That is {fmt(s['connections'] / s['orphan_shards'])} streams per orphan-index partition value where "
      f"100,000 connections on 64 shards put 1,562.5: **a scale of {fmt(s['scale'], 3)}**, so the partition limits are "
      f"scaled down alike, to **{fmt(s['write_units_per_s'])} write and {fmt(s['read_units_per_s'])} read units per "
      "second per partition value**, enforced by the local engine (`scripts/partition_limits.py`) for the processes "
      "and by the simulation for its engines. Each round is timed from the signal until every stream of the victim "
      "runs on another worker (the slowest of its streams); the simulation times its crash and its rolling "
      "replacement of five workers the same way.")
    w("")
    w("| | real processes, p50 | real processes, max | simulation |")
    w("|---|---|---|---|")
    rc, rg, ho = real["crash"], real["graceful"], sim["hand_over_ms"]
    w(f"| crash (SIGKILL): all the victim's streams held again | {fmt(rc['p50'])} ms | {fmt(rc['max'])} ms "
      f"({rc['rounds']} rounds) | {fmt(sim['crash_ms'])} ms |")
    w(f"| graceful (SIGTERM): all handed over | {fmt(rg['p50'])} ms | {fmt(rg['max'])} ms ({rg['rounds']} rounds) | "
      f"p50 {fmt(ho['p50'])} ms, max {fmt(ho['max'])} ms |")
    w(f"| cold start: all held | | | {fmt(sim['cold_start_ms'])} ms |")
    w("")
    la = real.get("load_average") or []
    if la:
        w(f"Load average on this shared machine during the real rounds: {', '.join(fmt(x, 1) for x in la)}.")
        w("")
    return "\n".join(lines) + "\n"


def explore_section(ex: Dict[str, Any] | None) -> str:
    """The fault explorer (core/examples/explore.rs): faults judged, violations, broken engines caught."""
    if not ex:
        return ""
    lines: List[str] = []
    w = lines.append
    w("## Fault exploration: seeded storms on a simulated fleet")
    w("")
    w("Every seed is a fleet of 2-4 engines (`leaselock::engine`) on the memory store and a manual clock, in per-item "
      "or session mode, at the default lease (20 s) or a short one (3 s), with lagging indexes and wall clocks up to a "
      "skew less one ms apart from the true time, under a storm of 1-12 faults close together: crashes and graceful "
      "shutdowns (each worker back with its id later), pauses past the lease, partitions (answers held back), "
      "ambiguous writes (applied, answered as timeouts), throttling, index lag, wall-clock steps, STOP/START "
      "(`leaselock::engine::explore`, run by `core/examples/explore.rs`). At every step it checks, from the store and "
      "the handlers' own records: never two handlers of one connection acting at once (tolerance 0 ms: rules 1 and "
      "2 together allow clocks twice the skew apart), fences strictly increasing per connection, checkpoints "
      "monotonic, and after the storm every STARTED connection running on a live worker within lease + 3 x skew + "
      "index lag + orphan interval + renew interval + 1 s, no STOPPED one running past one desired-state interval.")
    w("")
    w("| | |")
    w("|---|---|")
    w(f"| seeds run | {fmt(ex.get('seeds'))} (from seed {fmt(ex.get('first_seed'))}, {fmt(ex.get('threads'))} threads) |")
    w(f"| faults judged | {fmt(ex.get('faults_judged'))} in {fmt(ex.get('wall_s'), 1)} s: "
      f"**{fmt(ex.get('faults_per_s'))} a second** |")
    w(f"| store operations, handlers started, checkpoints | {fmt(ex.get('store_ops'))}, {fmt(ex.get('handlers_started'))}, "
      f"{fmt(ex.get('checkpoints'))} |")
    w(f"| violations | **{fmt(ex.get('violations'))}** |")
    fail = ex.get("failure")
    if fail:
        w(f"| first failing seed | {fail['seed']} (shortest failing prefix: {fail['prefix']} faults): {fail['what']} |")
    w(f"| slowest recovery after a storm's end | {fmt(ex.get('max_recovery_ms'))} ms |")
    for name, b in sorted((ex.get("broken") or {}).items()):
        label = {"index-lag": "index-lag fix off (the engines trust an empty owner listing at once)",
                 "rule2": "rule 2 off (owners act until their expiry)",
                 "fence": "fences off (every claim answers the first fence)",
                 "stop": "STOP unheard (every desired-state check answers STARTED)",
                 "deadline": "deadlines ignored (a held-back renewal sent up to a lease late)",
                 "cover": "session cover off (a session's handlers act until cancelled)"}.get(name, name)
        if b.get("seed") is None:
            w(f"| broken engine: {label} | not caught |")
        else:
            w(f"| broken engine: {label} | caught at seed {b['seed']}, after {fmt(b.get('seeds_needed'))} seeds "
              f"(shortest failing prefix {b.get('prefix')} faults): {b.get('what')} |")
    clusters = ex.get("by_last_cluster") or {}
    if clusters:
        w("")
        w("Recovery after the storm's end, by how many faults its last cluster held (faults overlapping within one lease):")
        w("")
        w("| faults in the last cluster | runs | slowest recovery after the storm's end | largest share of its bound |")
        w("|---|---|---|---|")
        for k in sorted(clusters, key=int):
            c = clusters[k]
            w(f"| {k} | {fmt(c['runs'])} | {fmt(c['max_after_end_ms'])} ms | {c['max_share_of_bound'] * 100:.0f}% |")
    w("")
    return "\n".join(lines) + "\n"


def session_section(r: Dict[str, Any], ss: Dict[str, Any], crash_setup: Dict[str, Any]) -> str:
    """Session-mode crash failover at the cheap setting, beside per-item at the defaults."""
    g = r.get
    k = g("crash_failover_scale") or 1
    steady, rounds = ss.get("steady") or {}, ss.get("rounds") or {}
    per_item_steady = crash_setup.get("steady") or {}
    lease, renew, skew, orphan = (ss.get(x) for x in ("lease_ms", "renew_ms", "clock_skew_ms", "orphan_interval_ms"))
    lines = [
        "### Session mode at the cheap setting",
        "",
        "| | per-item, defaults (20 s lease) | session mode, 5 s session lease |",
        "|---|---|---|",
        f"| crash failover p50 / p99 / max | {fmt(g('crash_failover_ms_p50'))} / {fmt(g('crash_failover_ms_p99'))} / "
        f"{fmt(g('crash_failover_ms_max'))} ms (scaled x{fmt(k)}) | {fmt(g('session_crash_failover_ms_p50'))} / "
        f"{fmt(g('session_crash_failover_ms_p99'))} / {fmt(g('session_crash_failover_ms_max'))} ms (unscaled) |",
        f"| writes per connection-hour, holding | {fmt(g('crash_failover_writes_per_connection_hour'), 1)} "
        f"(measured {fmt(g('crash_failover_writes_per_connection_hour_measured'), 1)} at renew {fmt(crash_setup.get('renew_ms'))} ms, / k) | "
        f"{fmt(g('session_failover_writes_per_connection_hour'), 1)} |",
        f"| writes per connection-hour, through the crash rounds | | {fmt(g('session_failover_writes_per_connection_hour_with_crashes'), 1)} |",
        f"| streams, workers | {fmt(crash_setup.get('connections'))}, {fmt(crash_setup.get('workers'))} | "
        f"{fmt(ss.get('connections'))}, {fmt(ss.get('workers'))} |",
        "",
        f"Method: the same bench (`cli/src/failover.rs`) in session mode at lease {fmt(lease)} ms, renew {fmt(renew)} ms, "
        f"skew {fmt(skew)} ms, orphan and dead-session query every {fmt(orphan)} ms, **unscaled**: {fmt(ss.get('failures'))} "
        f"SIGKILLs of the busiest of {fmt(ss.get('workers'))} worker processes holding {fmt(ss.get('connections'))} streams, "
        f"{fmt(ss.get('samples'))} stream samples ({fmt(ss.get('moved_before_signal'))} streams handed over before the signal "
        "left out; after each crash the replacement worker takes its share by balance before the next). A session claim "
        "writes no time on the connection item, so the claim instant is the one the claimer logs as the claim's answer "
        "arrives (`claimed`, its wall clock; all processes share one clock): reading the table instead would add "
        "requests to the engine the claims wait on. The expected window: a crash just after a session renewal waits "
        f"lease + skew = {fmt((lease or 0) + (skew or 0))} ms for the session to be dead beyond the skew, one just before "
        f"a renewal {fmt((lease or 0) - (renew or 0) + (skew or 0))} ms; the survivors read the fleet again at that "
        "moment (not at their next orphan query), then claim: each survivor takes the connections it ranks highest for "
        "among the live workers (rendezvous hashing) with TransactWriteItems of several connections each (the dead "
        "session's check once, each connection's takeover Update, conditioned on the item as the owner index listed it). "
        f"Machine load average (1 min) at the first and last round: {ss.get('load_average')}.",
        "",
        f"Writes per connection-hour: the lease table's item writes counted by the local engine (run with DynamoDB's "
        f"per-partition limits, so it bills and counts every write: `scripts/partition_limits.py`) over "
        f"{fmt((steady.get('window_ms') or 0) / 1000, 0)} s of steady holding before the first crash, the workers' "
        "fenced message writes with their checkpoints (the application's writes) left out: session mode "
        f"{steady.get('writes')}, i.e. one session renewal per worker per renew interval ({fmt(ss.get('connections'))} "
        f"streams over {fmt(ss.get('workers'))} workers). Through the crash rounds ({fmt((rounds.get('window_ms') or 0) / 1000, 0)} s, "
        f"claims and hand-overs to each replacement included): {rounds.get('writes')}. Per-item over its steady window "
        f"at renew {fmt(crash_setup.get('renew_ms'))} ms: {per_item_steady.get('writes')}, one renewal per stream per "
        "renew interval, scaled to the 5 s default by 1/k. Throttled requests in the windows: per-item "
        f"{per_item_steady.get('throttled_requests')}, session {steady.get('throttled_requests')}, "
        f"{rounds.get('throttled_requests')} through the session crash rounds (busiest write partitions there, "
        f"peak units in one second: {rounds.get('peak_write_partitions')}).",
        "",
    ]
    if g("session_failover_note"):
        lines += [g("session_failover_note"), ""]
    return "\n".join(lines)


def readme_table(r: Dict[str, Any]) -> str:
    """The README's headline figures beside the AWS post's (between the two markers)."""
    g = r.get
    k = g("crash_failover_scale")
    rows = [
        "| | AWS reference design (its post) | leaselock, `make bench` |",
        "|---|---|---|",
        f"| crash failover, 20 s lease, worst | ~{AWS_CRASH_WORST_S} s | {fmt(g('crash_failover_ms_max', 0) / 1000, 1)} s (p50 {fmt(g('crash_failover_ms_p50', 0) / 1000, 1)} s; measured at a shorter lease, scaled x{fmt(k)}) |",
        f"| graceful hand-over, worst | | {fmt(g('graceful_handover_ms_max'))} ms (p50 {fmt(g('graceful_handover_ms_p50'))} ms) |",
        *(
            [f"| crash failover, session mode at a 5 s session lease (100 connections per worker), p99 | | {fmt(g('session_crash_failover_ms_p99', 0) / 1000, 2)} s (max {fmt(g('session_crash_failover_ms_max', 0) / 1000, 2)} s; {fmt(g('session_failover_writes_per_connection_hour'), 1)} writes per connection-hour), unscaled |"]
            if g("session_crash_failover_ms_p99") is not None
            else []
        ),
        f"| writes per connection-hour | {AWS_WRITES_PER_CONNECTION_HOUR} | {fmt(g('writes_per_connection_hour'), 0)} per-item; {fmt(g('session_writes_per_connection_hour'), 1)} session mode |",
        f"| write units per connection-hour (index included) | ~{AWS_WRITES_PER_CONNECTION_HOUR * AWS_UNITS_PER_RENEWAL:,} | {fmt(g('write_units_per_connection_hour'), 0)} per-item; {fmt(g('session_write_units_per_connection_hour'), 1)} session mode |",
        f"| orphan query read units per worker-hour | | {fmt(g('orphan_query_read_units_per_hour'), 0)} (every 2 s) |",
        f"| client CPU per renew, us | | Rust {fmt(g('rust_cpu_us_per_renew'))}, Python {fmt(g('python_cpu_us_per_renew'))}, asyncio {fmt(g('python_async_cpu_us_per_renew'))} (boto3 {fmt(g('boto3_cpu_us_per_renew'))}), Node {fmt(g('node_cpu_us_per_renew'))} (JS SDK {fmt(g('jssdk_cpu_us_per_renew'))}) |",
        f"| election `run_if_leader`, ops/s | | {fmt(g('election_dynamodb_ops_per_s'))} DynamoDB API, {fmt(g('election_redis_ops_per_s'))} Redis (seed: {SEED_DYNAMODB_OPS} / {SEED_REDIS_OPS:,}) |",
    ]
    duration = g("bench_duration_s")
    run = (
        f"one `make bench` run on commit `{bench_commit(r)}` ({duration / 60:.0f} minutes end to end)"
        if duration
        else "the sections of `make bench`"
    )
    ran = (f"Measured by {run} on a 2-core machine against the\n"
           "local engine (moto); the method, each figure's anchor and the plots are in")
    return "\n".join(
        [
            README_START,
            "",
            "\n".join(rows),
            "",
            ran,
            "[bench/REPORT.md](bench/REPORT.md).",
            README_END,
        ]
    )


def update_readme(r: Dict[str, Any]) -> None:
    # Only a full run's figures (its commit recorded as it started) make the headline.
    if not r.get("bench_commit"):
        print("the README's headline is left as it is: these figures are not one full `make bench` run's")
        return
    text = README.read_text()
    if README_START not in text or README_END not in text:
        return
    head, rest = text.split(README_START, 1)
    _, tail = rest.split(README_END, 1)
    README.write_text(head + readme_table(r) + tail)


def main() -> None:
    results = json.loads(RESULTS.read_text())
    failover = json.loads(FAILOVER.read_text()) if FAILOVER.exists() else None
    if failover:
        plot_failover(failover, results)
    plot_cpu(results)
    plot_writes(results)
    (BENCH / "REPORT.md").write_text(report(results, failover))
    update_readme(results)
    print(f"wrote {BENCH / 'REPORT.md'}, its plots and the README's headline figures")


if __name__ == "__main__":
    sys.exit(main())
