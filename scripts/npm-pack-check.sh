#!/usr/bin/env bash
# Packs bindings/wasm with `npm pack` (into DEST, default a scratch directory), installs the
# tarball into a scratch npm project with the AWS SDK it names as a peer, and runs the Node sample
# of the manual's API page (docs/src/api-reference.md) there, as another project would, against
# the engine of AWS_ENDPOINT_URL (run under scripts/with-services.sh). No Rust toolchain is on
# PATH while it installs and runs.
# Needs the built package (scripts/build-wasm.sh).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${1:-}"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
[[ -n $dest ]] || dest="$scratch"
mkdir -p "$dest"
dest="$(cd "$dest" && pwd)"

tarball="$(cd "$root/bindings/wasm" && npm pack --silent --pack-destination "$dest")"
tarball="$dest/$tarball"
echo "npm-pack-check: $tarball ($(stat -c %s "$tarball") bytes)"
# What a registry would show and what an installing project gets: the wasm, the JavaScript
# driver, the types and the README, and nothing of the Rust sources.
files="$(tar -tzf "$tarball")"
for want in package/pkg/leaselock_wasm_bg.wasm package/index.js package/index.mjs package/index.d.ts package/README.md; do
  grep -qx "$want" <<<"$files" || { echo "npm-pack-check: $want is not in the tarball" >&2; exit 1; }
done
if grep -q '\.rs$' <<<"$files"; then
  echo "npm-pack-check: Rust sources in the tarball" >&2
  exit 1
fi

sdk="$(node -p "require('$root/bindings/wasm/package.json').devDependencies['@aws-sdk/client-dynamodb']")"
project="$scratch/project"
mkdir -p "$project"
# Node and npm only: the directories of rustup and cargo are left out of PATH.
path="$(tr ':' '\n' <<<"$PATH" | grep -v -e '\.cargo' -e '\.rustup' | paste -sd: -)"
(
  cd "$project"
  export PATH="$path"
  ! command -v cargo >/dev/null || { echo "npm-pack-check: cargo still on PATH" >&2; exit 1; }
  npm init -y >/dev/null
  npm install --prefer-offline --no-audit --no-fund --loglevel=error "$tarball" "@aws-sdk/client-dynamodb@$sdk"
  # The API page's Node sample, as written, twice on one table of its own.
  awk '/^## Node$/ { node = 1 } node && /^```js$/ { code = 1; next } code && /^```$/ { exit } code { print }' \
    "$root/docs/src/api-reference.md" >quickstart.mjs
  [[ -s quickstart.mjs ]] || { echo "npm-pack-check: no Node sample on the manual's API page" >&2; exit 1; }
  export LEASELOCK_TABLE="npm-pack-$$-$RANDOM"
  for fence in 1 2; do
    out="$(node quickstart.mjs 2>/dev/null)"
    [[ $out == *"report done under fence $fence" ]] || { echo "npm-pack-check: run $fence printed: $out" >&2; exit 1; }
  done
  echo "npm-pack-check: the tarball installs into a scratch project and the manual's Node sample runs there twice"
)
