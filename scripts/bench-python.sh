#!/usr/bin/env bash
# make bench, Python section: client CPU per renew and per acquire of leaselock (blocking and
# asyncio), the Rust LeaseTable and boto3, against a loopback keep-alive endpoint. Release builds
# (the figures are about optimized code); writes bench/results/latest.json.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p leaselock-bench-cpu
scripts/python-binding.sh --release
.venv/bin/python bindings/python/bench/cpu.py target/release/leaselock-bench-cpu "${OPS:-3000}"
