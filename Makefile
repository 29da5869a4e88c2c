# leaselock entry points.
#   make test   every test of the repository (installs what is missing, starts and stops services)
#   make demo   the local fleet demo
SHELL := /bin/bash
CARGO ?= cargo
# The fleet test gets a local engine of its own, so load from other tests cannot slow it.
FLEET_PORT ?= 4576
# The demo too: its figures are not skewed by whatever else the default engine is serving.
DEMO_PORT ?= 4577

.PHONY: test test-engine test-rust test-fleet test-lambdas test-infra lint services services-stop bench demo

test: lint test-engine test-rust test-fleet test-lambdas test-infra

lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy -p leaselock --no-default-features -- -D warnings
	scripts/install-wasm-target.sh build -p leaselock --no-default-features --target wasm32-unknown-unknown

# What scripts/local_engine.py changes in moto, checked over HTTP.
test-engine:
	scripts/with-services.sh .venv/bin/python scripts/test_local_engine.py

# Runs the tests of every crate, the Lambdas' handler tests included.
test-rust:
	scripts/with-services.sh $(CARGO) test --workspace

test-fleet:
	$(CARGO) build -q -p leaselock-cli
	MOTO_PORT=$(FLEET_PORT) scripts/with-services.sh tests/fleet.sh

test-lambdas:
	SKIP_CARGO_TEST=1 lambdas/test.sh

test-infra:
	scripts/install-infra-tools.sh
	infra/test.sh

services:
	scripts/services.sh start

services-stop:
	scripts/services.sh stop

demo:
	$(CARGO) build --release -q -p leaselock-cli
	MOTO_PORT=$(DEMO_PORT) scripts/with-services.sh target/release/leaselock demo

bench:
	lambdas/bench.sh
	core/bench.sh
