#!/usr/bin/env python3
"""Summarises the failover runs of bench/failover.sh: writes every sample to
bench/results/failover.json and merges the headline keys into bench/results/latest.json.

Crash samples were measured with every timing knob (lease, renew interval, clock skew, orphan
query interval) divided by the same factor k = 20000 ms / measured lease; failover time is a sum
of those knobs plus request latencies, so the figure at the default 20 s lease is the measured one
times k. That also multiplies the request and process latencies by k, so the scaled figure
overstates them (it errs high). Hand-overs run at the defaults and are not scaled.

Session-mode crash samples (SESSION_JSON) were measured at a 5 s session lease, the setting they
report, and are not scaled. Writes per connection-hour come from the local engine's counts of the
lease table's writes over a steady window (cli/src/failover.rs): session mode's as measured;
per-item's measured at the scaled knobs (renew 1.25 s) and divided by k for the defaults (a
renewal per renew interval: the count scales exactly).

usage: failover.py CRASH_JSON GRACEFUL_JSON [SESSION_JSON]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent))
from merge import merge  # noqa: E402

DEFAULT_LEASE_MS = 20_000


def last_json(path: str) -> Dict[str, Any]:
    lines = [line for line in Path(path).read_text().splitlines() if line.startswith("{")]
    if not lines:
        sys.exit(f"failover.py: no report in {path}")
    return json.loads(lines[-1])


def pct(samples: List[float], p: float) -> float:
    """Nearest-rank percentile."""
    xs = sorted(samples)
    return xs[max(0, min(len(xs) - 1, int(round(p / 100 * len(xs) + 0.5)) - 1))]


def writes(run: Dict[str, Any], key: str) -> Any:
    count = run.get(key)
    return None if count is None else count["writes_per_connection_hour"]


def main() -> None:
    crash, graceful = last_json(sys.argv[1]), last_json(sys.argv[2])
    session = last_json(sys.argv[3]) if len(sys.argv) > 3 else None
    for run in (crash, graceful, session):
        if run is None:
            continue
        # A stream claimed by another worker before the signal (the victim had already lost it)
        # is no failover sample (older reports recorded it as 0 ms).
        zeros = [s for s in run["samples_ms"] if s <= 0]
        run["samples_ms"] = [s for s in run["samples_ms"] if s > 0]
        run["moved_before_signal"] = run.get("moved_before_signal", 0) + len(zeros)
    k = DEFAULT_LEASE_MS / crash["lease_ms"]
    scaled = [s * k for s in crash["samples_ms"]]
    hand = graceful["samples_ms"]
    figures: Dict[str, Any] = {
        "crash_failover_ms_p50": round(pct(scaled, 50)),
        "crash_failover_ms_p99": round(pct(scaled, 99)),
        "crash_failover_ms_max": round(max(scaled)),
        "crash_failover_measured_ms_p50": pct(crash["samples_ms"], 50),
        "crash_failover_measured_ms_max": max(crash["samples_ms"]),
        "crash_failover_scale": k,
        "graceful_handover_ms_p50": pct(hand, 50),
        "graceful_handover_ms_p99": pct(hand, 99),
        "graceful_handover_ms_max": max(hand),
        "sigterm_exit_ms_max": max(graceful.get("exit_ms") or [0]),
        "failover_setup": {
            "crash": {key: crash[key] for key in ("failures", "connections", "workers", "lease_ms", "renew_ms", "clock_skew_ms", "orphan_interval_ms")}
            | {"samples": len(crash["samples_ms"]), "scaled_to_lease_ms": DEFAULT_LEASE_MS, "load_average": crash.get("load_average"), "moved_before_signal": crash["moved_before_signal"]},
            "graceful": {key: graceful[key] for key in ("failures", "connections", "workers", "lease_ms", "renew_ms", "clock_skew_ms", "orphan_interval_ms")}
            | {"samples": len(hand), "load_average": graceful.get("load_average"), "moved_before_signal": graceful["moved_before_signal"]},
            "method": "real worker processes (leaselock worker) killed with SIGKILL / stopped with SIGTERM, the busiest "
            "first, one replacement started after each; per stream the victim held: signal to another worker's claim "
            "(the claim's own expiry minus the lease). Crash: every timing knob / k, figures x k "
            "(k = 20000 / measured lease); hand-over at the defaults, unscaled.",
        },
    }
    per_item_writes = writes(crash, "steady")
    if per_item_writes is not None:
        figures["crash_failover_writes_per_connection_hour_measured"] = per_item_writes
        figures["crash_failover_writes_per_connection_hour"] = round(per_item_writes / k, 2)
        figures["failover_setup"]["crash"]["steady"] = crash["steady"]
    if session is not None:
        samples = session["samples_ms"]
        figures |= {
            "session_crash_failover_ms_p50": pct(samples, 50),
            "session_crash_failover_ms_p99": pct(samples, 99),
            "session_crash_failover_ms_max": max(samples),
            "session_failover_writes_per_connection_hour": writes(session, "steady"),
            "session_failover_writes_per_connection_hour_with_crashes": writes(session, "rounds"),
        }
        figures["failover_setup"]["session"] = {
            key: session[key]
            for key in ("failures", "connections", "workers", "lease_ms", "renew_ms", "clock_skew_ms", "orphan_interval_ms", "claim_instant")
        } | {
            "samples": len(samples),
            "load_average": session.get("load_average"),
            "moved_before_signal": session["moved_before_signal"],
            "per_failure_max_ms": session["per_failure_max_ms"],
            "steady": session.get("steady"),
            "rounds": session.get("rounds"),
            "method": "session mode, real worker processes killed with SIGKILL (the busiest first; one replacement "
            "started after each and given time to take its share by balance before the next), unscaled; per stream "
            "the victim held: signal to the claim as the claimer logged it (its wall clock when the claim's answer "
            "arrived; session claims write no time on the item, and reading the table would add requests to the "
            "engine the claims wait on).",
        }
    # Beside the results file this run merges into: a failover section run alone writes
    # partial-failover.json, never the full run's samples.
    from merge import RESULTS

    out = RESULTS.with_name("failover.json" if RESULTS.name == "latest.json" else f"{RESULTS.stem}-failover.json")
    record = {"crash": crash, "graceful": graceful, "crash_scale": k}
    if session is not None:
        record["session_crash"] = session
    out.write_text(json.dumps(record, indent=1) + "\n")
    merge(figures)
    print(
        f"crash failover at a {DEFAULT_LEASE_MS // 1000} s lease (measured at {crash['lease_ms']} ms, x{k:g}): "
        f"p50 {figures['crash_failover_ms_p50']} ms, max {figures['crash_failover_ms_max']} ms over "
        f"{len(scaled)} streams of {crash['failures']} SIGKILLs; graceful hand-over p50 "
        f"{figures['graceful_handover_ms_p50']} ms, max {figures['graceful_handover_ms_max']} ms over "
        f"{len(hand)} streams of {graceful['failures']} SIGTERMs"
    )
    if session is not None:
        print(
            f"session-mode crash failover at a {session['lease_ms']} ms session lease, unscaled: "
            f"p50 {figures['session_crash_failover_ms_p50']} ms, p99 {figures['session_crash_failover_ms_p99']} ms, "
            f"max {figures['session_crash_failover_ms_max']} ms over {len(session['samples_ms'])} streams of "
            f"{session['failures']} SIGKILLs; writes per connection-hour: session "
            f"{figures['session_failover_writes_per_connection_hour']}, per-item at the defaults "
            f"{figures.get('crash_failover_writes_per_connection_hour')}"
        )


if __name__ == "__main__":
    main()
