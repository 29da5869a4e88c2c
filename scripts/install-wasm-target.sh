#!/usr/bin/env bash
# Makes sure core can be built for wasm32-unknown-unknown, then (given cargo arguments) builds it.
#   scripts/install-wasm-target.sh                       install the target when missing
#   scripts/install-wasm-target.sh build -p leaselock --no-default-features --target wasm32-unknown-unknown
# Idempotent. `rustup target add` first; when that fails (offline), the fallback of
# TOOLCHAIN.md: Debian's rustc with its own std sources, building std for wasm on the way.
set -euo pipefail

target=wasm32-unknown-unknown
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
marker="$root/target/.wasm-toolchain"

have_rustup_target() {
  command -v rustup >/dev/null && rustup target list --installed 2>/dev/null | grep -qx "$target"
}

if have_rustup_target; then
  mode=rustup
elif [[ -f "$marker" && "$(cat "$marker")" == debian && -x /usr/bin/cargo ]]; then
  mode=debian
elif command -v rustup >/dev/null && rustup target add "$target"; then
  mode=rustup
else
  echo "wasm: rustup target add $target failed; installing Debian's rust-web toolchain" >&2
  apt-get install -y rustc-web cargo-web rust-web-src lld-22
  mode=debian
fi
mkdir -p "$(dirname "$marker")"
echo "$mode" >"$marker"
echo "wasm: $target ready ($mode)"

if (($#)); then
  cd "$root"
  if [[ "$mode" == rustup ]]; then
    cargo "$@"
  else
    RUSTC_BOOTSTRAP=1 /usr/bin/cargo "$@" -Zbuild-std=std,panic_abort
  fi
fi
