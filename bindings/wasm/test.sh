#!/usr/bin/env bash
# Runs the Node package's tests (scripts/build-wasm.sh builds it first; the engine comes from
# scripts/with-services.sh). Node 20's test runner does not expand globs: the files are listed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
# index.d.ts against a file that uses every type it exports.
node_modules/.bin/tsc -p tests/types
node --test --test-concurrency=1 \
  tests/errors.test.js \
  tests/options_typed.test.js \
  tests/hostile.test.js \
  tests/table.test.js \
  tests/global_table.test.js \
  tests/ambiguous.test.js \
  tests/worker.test.js \
  tests/session.test.mjs \
  tests/manual.test.js \
  tests/example.test.js \
  tests/conformance.test.mjs \
  tests/worker_traces.test.mjs \
  tests/elector_traces.test.mjs \
  tests/holder_traces.test.mjs
# The tarball `npm pack` makes, installed into a scratch project, runs the manual's Node sample.
../../scripts/npm-pack-check.sh
# The election tests time real processes against leases: on an engine of their own
# (with-services.sh runs its command from the repository root).
MOTO_PORT="${ELECTION_MOTO_PORT:-4589}" ../../scripts/with-services.sh node --test bindings/wasm/tests/election.test.mjs
