# leaselock entry points. `make test` runs every test of the repository; `make demo` the local demo.
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: test test-rust lint services services-stop bench demo

test: lint test-rust

lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy -p leaselock --no-default-features -- -D warnings

test-rust:
	scripts/with-services.sh $(CARGO) test --workspace

services:
	scripts/services.sh start

services-stop:
	scripts/services.sh stop
