#!/usr/bin/env bash
# Builds the Node package in bindings/wasm: the wasm32 target and wasm-bindgen-cli are installed
# when missing, the crate is compiled (release with LTO: the one non-debug build of
# `make test`), wasm-bindgen writes bindings/wasm/pkg (--target nodejs), wasm-opt optimizes it when
# the npm `binaryen` package is installed, and the package's npm dependencies are installed.
# Safe to run repeatedly: each step is skipped when its result is already in place.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
pkg=bindings/wasm
target=wasm32-unknown-unknown
out="${CARGO_TARGET_DIR:-target}/$target/release/leaselock_wasm.wasm"

# The CLI must be the exact version of the wasm-bindgen crate the build links (Cargo.lock).
want="$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/version = |"/, ""); print; exit }' Cargo.lock)"
if [[ -z "$want" ]]; then
  echo "build-wasm: no wasm-bindgen in Cargo.lock" >&2
  exit 1
fi
have="$(wasm-bindgen --version 2>/dev/null | awk '{ print $2 }' || true)"
if [[ "$have" != "$want" ]]; then
  echo "build-wasm: cargo install --debug wasm-bindgen-cli --version $want into ~/.cargo/bin (have: ${have:-none}; about a minute)"
  # Not --locked: its lock file names a yanked transitive version. --debug: half the build time
  # of a release build (67 s against 138 s on two cores), for 1 s instead of 0.2 s per run and
  # byte-identical output. --force: cargo's record of an install whose binary is gone (or of
  # another version) would otherwise make this a no-op.
  cargo install --debug --force wasm-bindgen-cli --version "$want"
fi

# Optimized for size, LTO and one codegen unit; applies to this build only. With the worker
# engine in the wasm, opt-level 3 made it 1,088,683 bytes (397,567 gzipped); "s" makes it 940,254
# (359,674) for ~4 us more of the protocol's own CPU per renew (17 -> 21 us with an in-memory
# client; a renew through the JS SDK costs ~500 us), "z" 841,329 for ~10 us more; 2 is as large as
# 3. Node compiles and instantiates each in ~14 ms. make bench-wasm holds the size to a limit.
export CARGO_PROFILE_RELEASE_OPT_LEVEL=s CARGO_PROFILE_RELEASE_LTO=true CARGO_PROFILE_RELEASE_CODEGEN_UNITS=1
export CARGO_PROFILE_RELEASE_PANIC=abort
# The target (or TOOLCHAIN.md's offline fallback) comes from the shared installer.
scripts/install-wasm-target.sh build -q -p leaselock-wasm --target "$target" --release >/dev/null

# npm dependencies first: binaryen (wasm-opt) comes with them.
if [[ ! -d $pkg/node_modules || $pkg/package-lock.json -nt $pkg/node_modules ]]; then
  echo "build-wasm: npm ci in $pkg"
  (cd "$pkg" && npm ci --no-audit --no-fund --loglevel=error)
  # Marks the install time for the staleness check above.
  touch "$pkg/node_modules"
fi

stamp="$pkg/pkg/.built-from"
if [[ -f $stamp && $stamp -nt $out && -f $pkg/pkg/leaselock_wasm_bg.wasm ]]; then
  exit 0
fi
rm -rf "$pkg/pkg"
wasm-bindgen --target nodejs --out-dir "$pkg/pkg" "$out"
wasm_opt="$pkg/node_modules/.bin/wasm-opt"
if [[ -x $wasm_opt ]]; then
  # The features come from the module's target_features section.
  "$wasm_opt" -O3 --strip-debug --strip-producers "$pkg/pkg/leaselock_wasm_bg.wasm" -o "$pkg/pkg/leaselock_wasm_bg.wasm"
fi
touch "$stamp"
echo "build-wasm: $pkg/pkg/leaselock_wasm_bg.wasm $(stat -c %s "$pkg/pkg/leaselock_wasm_bg.wasm") bytes"
