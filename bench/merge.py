#!/usr/bin/env python3
"""Merges benchmark figures into bench/results/latest.json, key by key: read, update, write.

Every section of `make bench` goes through this one helper, so no section overwrites another's
keys. The update is made under an exclusive lock (sections may run at the same time) and lands
with an atomic rename (a reader never sees half a file).

usage: merge.py [FILE]   a JSON object on stdin (or in FILE); prints the keys it merged
   or: import merge; merge.merge({"key": value})
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, Optional

# A full `make bench` points this at bench/results/latest.json (what the report and the README's
# headline are written from); a section run alone writes bench/results/partial.json, so it never
# mixes into a full run's figures.
RESULTS = Path(os.environ.get("LEASELOCK_BENCH_RESULTS", Path(__file__).resolve().parent / "results" / "latest.json"))


def merge(figures: Dict[str, Any], path: Optional[Path] = None) -> Dict[str, Any]:
    """Sets each key of `figures` in the results file, keeping every other key; returns the
    whole merged object."""
    path = Path(path or RESULTS)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            results = json.loads(path.read_text()) if path.exists() else {}
        except json.JSONDecodeError:
            results = {}
        results.update(figures)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".latest-")
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(results, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, path)
    return results


def main() -> None:
    text = Path(sys.argv[1]).read_text() if len(sys.argv) > 1 else sys.stdin.read()
    figures = json.loads(text)
    if not isinstance(figures, dict):
        sys.exit("merge.py: expected a JSON object")
    merge(figures)
    print(f"merged {', '.join(sorted(figures))} into {RESULTS}")


if __name__ == "__main__":
    main()
