#!/usr/bin/env python3
"""Summarises the failover runs of bench/failover.sh: writes every sample to
bench/results/failover.json and merges the headline keys into bench/results/latest.json.

Crash samples were measured with every timing knob (lease, renew interval, clock skew, orphan
query interval) divided by the same factor k = 20000 ms / measured lease; failover time is a sum
of those knobs plus request latencies, so the figure at the default 20 s lease is the measured one
times k. That also multiplies the request and process latencies by k, so the scaled figure
overstates them (it errs high). Hand-overs run at the defaults and are not scaled.

usage: failover.py CRASH_JSON GRACEFUL_JSON
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


def main() -> None:
    crash, graceful = last_json(sys.argv[1]), last_json(sys.argv[2])
    for run in (crash, graceful):
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
    out = Path(__file__).resolve().parent / "results" / "failover.json"
    out.write_text(json.dumps({"crash": crash, "graceful": graceful, "crash_scale": k}, indent=1) + "\n")
    merge(figures)
    print(
        f"crash failover at a {DEFAULT_LEASE_MS // 1000} s lease (measured at {crash['lease_ms']} ms, x{k:g}): "
        f"p50 {figures['crash_failover_ms_p50']} ms, max {figures['crash_failover_ms_max']} ms over "
        f"{len(scaled)} streams of {crash['failures']} SIGKILLs; graceful hand-over p50 "
        f"{figures['graceful_handover_ms_p50']} ms, max {figures['graceful_handover_ms_max']} ms over "
        f"{len(hand)} streams of {graceful['failures']} SIGTERMs"
    )


if __name__ == "__main__":
    main()
