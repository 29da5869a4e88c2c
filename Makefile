# leaselock entry points.
#   make test   every test of the repository (installs what is missing, starts and stops services)
#   make demo   the local fleet demo
SHELL := /bin/bash
CARGO ?= cargo
# The fleet test gets a local engine of its own, so load from other tests cannot slow it.
FLEET_PORT ?= 4576
# The index lag test's engine (its owner index 8 s behind).
INDEX_LAG_PORT ?= 4579
# How far the fleet tests' engine's global secondary indexes lag behind its tables, ms.
FLEET_INDEX_LAG_MS ?= 1000
# The demo too: its figures are not skewed by whatever else the default engine is serving.
DEMO_PORT ?= 4577
# And the election benchmark (it also uses the local Redis, see scripts/redis.sh).
ELECTION_BENCH_PORT ?= 4578
# The failover bench's engines (crash and graceful rounds run at the same time; session-mode
# crash rounds after them, on a third).
FAILOVER_CRASH_PORT ?= 4584
FAILOVER_GRACEFUL_PORT ?= 4585
FAILOVER_SESSION_PORT ?= 4586
FLEET_POINT_PORT ?= 4587

.PHONY: bench-fleet-point docs docs-check test test-docs test-engine test-rust test-fleet test-lambdas test-infra test-python test-node lint services services-stop bench bench-sections bench-python bench-node bench-wasm bench-lambdas bench-election bench-write-cost bench-failover bench-explore explore-long bench-report demo wheel dist

test: lint test-engine test-rust test-fleet test-lambdas test-infra test-python test-node test-docs

lint:
	$(CARGO) fmt --all --check
	scripts/same-features.py leaselock-cli leaselock-python
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy -p leaselock --no-default-features --features sim --lib --example fleet_sim --example explore -- -D warnings
	scripts/install-wasm-target.sh build -p leaselock --no-default-features --target wasm32-unknown-unknown

# What scripts/local_engine.py changes in moto, checked over HTTP; and wrappers running at once
# sharing one engine and one Redis (scripts/test_services.sh).
test-engine:
	scripts/services.sh install
	scripts/with-services.sh .venv/bin/python scripts/test_local_engine.py
	scripts/test_services.sh

# Runs the tests of every crate, the Lambdas' handler tests included (core/tests/hot_partition.rs
# starts a local engine of its own with per-partition limits).
test-rust:
	scripts/with-services.sh $(CARGO) test --workspace

# A Rust, a Python and a Node worker on one table: the binding into .venv and the Node package
# are built first (both scripts skip what is already in place). The engine's indexes lag 1 s, as
# DynamoDB's usually do; tests/index_lag.sh kills claimers under an owner index 8 s behind.
test-fleet:
	scripts/services.sh install
	scripts/python-binding.sh
	scripts/build-wasm.sh
	$(CARGO) build -q -p leaselock-cli
	MOTO_PORT=$(FLEET_PORT) LEASELOCK_ENGINE_INDEX_LAG_MS=$(FLEET_INDEX_LAG_MS) scripts/with-services.sh tests/fleet.sh
	MOTO_PORT=$(FLEET_PORT) LEASELOCK_ENGINE_INDEX_LAG_MS=$(FLEET_INDEX_LAG_MS) scripts/with-services.sh tests/balance.sh
	MOTO_PORT=$(INDEX_LAG_PORT) LEASELOCK_ENGINE_INDEX_LAG_MS=$(FLEET_INDEX_LAG_MS),lease_owner-index=8000 \
	  scripts/with-services.sh tests/index_lag.sh

test-lambdas:
	SKIP_CARGO_TEST=1 lambdas/test.sh

test-infra:
	scripts/install-infra-tools.sh
	infra/test.sh

# The Python binding, built (debug, the workspace's target dir) into .venv: its tests against the
# local engine, the stubs against the native module, the manual's samples, the example worker.
test-python:
	scripts/python-binding.sh
	scripts/with-services.sh .venv/bin/python -m pytest -q bindings/python/tests
	.venv/bin/python -m mypy.stubtest leaselock
	$(CARGO) build -q -p leaselock-cli
	scripts/with-services.sh scripts/python-example.sh

# The abi3 wheel of the Python binding (one wheel for CPython 3.9 and later), into dist/: linked
# by zig against glibc 2.17 (manylinux2014), so Amazon Linux 2 and other older images install it.
wheel:
	scripts/venv.sh
	.venv/bin/pip install -q 'maturin>=1.16,<1.17' ziglang
	PATH="$$PWD/.venv/bin:$$PATH" .venv/bin/maturin build -q --release -m bindings/python/Cargo.toml --out dist \
	  --compatibility manylinux2014 --zig

# What a release would publish, into dist/, each checked as its registry would (scripts/dist.sh):
# sdist and manylinux2014 abi3 wheel (twine check, installed into a scratch venv), the npm
# tarball (installed into a scratch project), the crates (cargo package, publish --dry-run).
# Release builds: not part of `make test`.
dist:
	scripts/with-services.sh scripts/dist.sh

# The manual (mdBook, docs/src/; diagrams from docs/diagrams/ by Graphviz) and the API reference
# of each language (rustdoc, pdoc, TypeDoc) into target/docs/; every link and image of the
# manual is checked. mdBook (pinned) and Graphviz are installed when missing
# (scripts/install-docs-tools.sh).
docs:
	scripts/docs.sh

# The manual alone, built and checked (links, images, diagrams) without the API references. Its
# samples run in test-python (Python, Rust) and test-node (Node).
test-docs:
	scripts/docs.sh --manual
	tests/bench_plumbing.sh

# make docs, then every page of the manual opened in headless Chromium (Debian's chromium,
# installed when missing): a page that logs an error, has a broken image or shows no diagram it
# names fails it; a screenshot of each goes to target/docs/screenshots/.
docs-check: docs
	scripts/docs-check.sh

# The Node package (wasm + JavaScript driver) against the local engine; the example worker
# test runs against the CLI's local feed.
test-node:
	scripts/build-wasm.sh
	$(CARGO) build -q -p leaselock-cli
	scripts/with-services.sh bindings/wasm/test.sh

# The local AWS engine and the local Redis (scripts/redis.sh).
services:
	scripts/services.sh start

services-stop:
	scripts/services.sh stop

# The mixed fleet (Rust, Python and Node workers), from a fresh clone: what it runs is built first.
# Its engine's indexes lag 1 s behind its tables, as DynamoDB's usually do.
# The CLI and the Python binding are release builds of one feature set (scripts/same-features.py
# in lint), so the second reuses every dependency the first compiled.
demo:
	scripts/services.sh install
	$(CARGO) build --release -q -p leaselock-cli
	scripts/python-binding.sh --release
	scripts/build-wasm.sh
	MOTO_PORT=$(DEMO_PORT) LEASELOCK_ENGINE_INDEX_LAG_MS=$(FLEET_INDEX_LAG_MS) scripts/with-services.sh target/release/leaselock demo

# A full run's figures go to bench/results/latest.json (the report and the README's headline are
# written from it, naming the commit the run started on); a section run alone (make bench-failover)
# merges into bench/results/partial.json instead, so it never mixes into a full run's figures.
FULL_RESULTS := $(CURDIR)/bench/results/latest.json
LEASELOCK_BENCH_RESULTS ?= $(CURDIR)/bench/results/partial.json
export LEASELOCK_BENCH_RESULTS

# make bench: every section merges its keys into bench/results/latest.json (bench/merge.py), then
# bench/report.py writes bench/REPORT.md and its plots. The file starts empty, so every key in it
# comes from this run (a section run alone merges into what is there). The run's duration, builds included, is
# recorded as bench_duration_s.
# One line per step, so that `make -n bench` only prints them: a line naming $(MAKE) runs even
# under -n (with -n passed on, so the sections print their commands), and no other line does.
bench:
	@mkdir -p target && date +%s > target/bench-started
	bench/tree-state.sh > target/bench-tree.json
	rm -f bench/results/latest.json
	LEASELOCK_BENCH_RESULTS=$(FULL_RESULTS) python3 bench/merge.py < target/bench-tree.json
	$(MAKE) --no-print-directory bench-sections LEASELOCK_BENCH_RESULTS=$(FULL_RESULTS)
	echo "{\"bench_duration_s\": $$(( $$(date +%s) - $$(cat target/bench-started) ))}" | LEASELOCK_BENCH_RESULTS=$(FULL_RESULTS) python3 bench/merge.py
	$(MAKE) --no-print-directory bench-report

bench-sections: bench-python bench-node bench-wasm bench-lambdas bench-election bench-write-cost bench-failover bench-fleet-sim bench-fleet-point bench-explore

bench-lambdas:
	lambdas/bench.sh

# run_if_leader throughput on the local engine and the local Redis.
bench-election:
	MOTO_PORT=$(ELECTION_BENCH_PORT) scripts/with-services.sh $(CARGO) test --release -q -p leaselock --features redis --test election_bench -- --ignored --nocapture

# Requests, writes and write units per connection-hour in both modes; orphan query read units.
bench-write-cost:
	core/bench.sh

# The fleet simulation on the worker engine (memory store, manual clock): 100,000 connections on
# 150 workers of 700, peak capacity units per partition value in both modes and at the cheap
# session setting (core/examples/fleet_sim.rs; its arguments scale it): per-item mode on one
# STARTED value and on 128 shards, session mode on 64; a rolling deploy replaces 20 workers.
# The memory store keeps its orphan and owner indexes as DynamoDB keeps its GSIs, so a query
# reads what it returns: about ten minutes in release on two cores.
bench-fleet-sim:
	nice -n 10 $(CARGO) run --release -q -p leaselock --no-default-features --features sim --example fleet_sim -- 100000 150 700 20 128 | python3 bench/merge.py

# The fault explorer (core/examples/explore.rs, leaselock::engine::explore): seeded storms of
# faults on a simulated fleet, every invariant checked at every step, on two threads until
# EXPLORE_FAULTS faults (10^6) have been judged (about 2,200 a second on 2 cores: some 7.5 minutes), then
# each deliberately broken engine from the same first seed until it is caught. Faults judged per
# second, violations and the seeds each broken engine took go into the "explore" key.
EXPLORE_FAULTS ?= 1000000
bench-explore:
	nice -n 10 $(CARGO) run --release -q -p leaselock --no-default-features --features sim --example explore -- --faults $(EXPLORE_FAULTS) --json | python3 bench/merge.py

# The explorer for as long as you like: EXPLORE_LONG_FAULTS faults (10^8: about 13 hours on 2
# cores) from seed EXPLORE_FIRST; it stops at the first violation and prints the seed, the shortest
# failing prefix of its storm and the command that replays it.
EXPLORE_LONG_FAULTS ?= 100000000
EXPLORE_FIRST ?= 1000000
explore-long:
	$(CARGO) run --release -q -p leaselock --no-default-features --features sim --example explore -- --faults $(EXPLORE_LONG_FAULTS) --first $(EXPLORE_FIRST)

# Crash failover (SIGKILL) and graceful hand-over (SIGTERM) distributions, real worker processes;
# session-mode crash failover at a 5 s session lease, unscaled; writes per connection-hour of both.
bench-failover:
	FAILOVER_CRASH_PORT=$(FAILOVER_CRASH_PORT) FAILOVER_GRACEFUL_PORT=$(FAILOVER_GRACEFUL_PORT) \
	  FAILOVER_SESSION_PORT=$(FAILOVER_SESSION_PORT) bench/failover.sh

# One point of the fleet simulation's curve by real worker processes at partition limits scaled
# down alike, and the simulation at the same settings beside it.
bench-fleet-point:
	FLEET_POINT_PORT=$(FLEET_POINT_PORT) bench/fleet_point.sh

# bench/REPORT.md and the PNG plots from the results (matplotlib installed into .venv if missing).
bench-report:
	scripts/venv.sh
	.venv/bin/python -c 'import matplotlib' 2>/dev/null || .venv/bin/pip install -q matplotlib
	.venv/bin/python bench/report.py

# Client CPU per renew and per acquire: leaselock (sync, asyncio), the Rust LeaseTable and boto3,
# against a keep-alive endpoint; writes bench/results/latest.json.
bench-python:
	scripts/bench-python.sh

# Client CPU per renew: leaselock for Node vs the same UpdateItem through @aws-sdk/client-dynamodb.
bench-node:
	scripts/build-wasm.sh
	node bindings/wasm/bench/renew.js

# The Node package's .wasm: size, gzipped size and Node's load time; fails when the wasm is larger
# than its limit (bindings/wasm/bench/size.js says which and why).
bench-wasm:
	scripts/build-wasm.sh
	node bindings/wasm/bench/size.js
