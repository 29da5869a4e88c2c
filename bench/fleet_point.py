#!/usr/bin/env python3
"""Merges bench/fleet_point.sh's runs under `fleet_point`: the real processes' crash and graceful
rounds (per round, from the signal until every stream of the victim ran on another worker) and
the simulation's crash and rolling deploy at the same settings, with the scaled limits.

usage: fleet_point.py CRASH_JSON GRACEFUL_JSON SIM_JSON SETTINGS_JSON
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from failover import last_json, pct  # noqa: E402
from merge import merge  # noqa: E402


def summary(values: list) -> dict:
    return {"rounds": len(values), "p50": pct(values, 50), "max": max(values), "samples_ms": values}


def main() -> None:
    crash, graceful = last_json(sys.argv[1]), last_json(sys.argv[2])
    sim = last_json(sys.argv[3])["fleet_sim"]
    settings = json.loads(sys.argv[4])
    (mode,) = sim["modes"].values()
    phases = mode["phases"]
    point = {
        "settings": {
            **settings,
            "connections": sim["connections"],
            "workers": sim["workers"],
            "lease_ms": mode["lease_ms"],
            "renew_ms": mode["renew_ms"],
            "skew_ms": mode["skew_ms"],
            "orphan_interval_ms": mode["orphan_interval_ms"],
        },
        "real": {
            "crash": summary(crash["per_failure_max_ms"]),
            "graceful": summary(graceful["per_failure_max_ms"]),
            "load_average": crash.get("load_average", []) + graceful.get("load_average", []),
        },
        "sim": {
            "cold_start_ms": phases["cold_start"]["all_held_after_ms"],
            "crash_ms": phases["crash"]["all_held_after_ms"],
            "hand_over_ms": phases["rolling_deploy"]["hand_over_ms"],
            "throttled": {p: phases[p]["throttled"]["requests"] for p in phases},
        },
    }
    merge({"fleet_point": point})
    print(json.dumps(point["real"]["crash"] | {"kind": "crash"}), file=sys.stderr)


if __name__ == "__main__":
    main()
