#!/usr/bin/env bash
# make dist: what a release would publish, into dist/, each checked the way its registry checks it.
#   - Python: the sdist and the abi3 wheel for manylinux2014 (zig links against glibc 2.17),
#     `twine check`, then the wheel installed into a scratch venv (no Rust toolchain on PATH) and
#     the first Python sample of the manual's API page run there twice against the local engine;
#   - Node: `npm pack` of bindings/wasm, installed into a scratch npm project, the API page's Node
#     sample run there twice (scripts/npm-pack-check.sh);
#   - Rust: `cargo package` of the leaselock crate, `cargo publish --dry-run` of it and the CLI.
# Every version comes from [workspace.package] in Cargo.toml; the ones that cannot read it are
# checked against it first. Run under scripts/with-services.sh (the Makefile does).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root="$PWD"

version="$(awk '/^\[workspace.package\]/ { p = 1 } p && /^version = / { gsub(/version = |"/, ""); print; exit }' Cargo.toml)"
npm_version="$(node -p "require('./bindings/wasm/package.json').version")"
dep_version="$(sed -n 's/^leaselock = { path = "core", version = "\([^"]*\)".*/\1/p' Cargo.toml)"
if [[ $npm_version != "$version" || $dep_version != "$version" ]]; then
  echo "dist: versions differ: workspace $version, bindings/wasm/package.json $npm_version, workspace leaselock dependency $dep_version" >&2
  exit 1
fi
echo "dist: version $version"
rm -rf dist
mkdir -p dist

# --- Python
scripts/venv.sh
.venv/bin/pip install -q 'maturin>=1.16,<1.17' ziglang twine
rustup target list --installed | grep -qx x86_64-unknown-linux-gnu
.venv/bin/maturin sdist -m bindings/python/Cargo.toml --out dist
PATH="$root/.venv/bin:$PATH" .venv/bin/maturin build --release -m bindings/python/Cargo.toml --out dist \
  --compatibility manylinux2014 --zig
.venv/bin/twine check dist/*.whl dist/*.tar.gz
wheel="$(ls dist/*.whl)"
echo "dist: wheel $(basename "$wheel")"

check="$(mktemp -d)"
trap 'rm -rf "$check"' EXIT
python3 -m venv "$check/venv"
path="$(tr ':' '\n' <<<"$PATH" | grep -v -e '\.cargo' -e '\.rustup' -e "$root/.venv" | paste -sd: -)"
awk '/^## Python$/ { py = 1 } py && /^```python$/ { code = 1; next } code && /^```$/ { exit } code { print }' \
  docs/src/api-reference.md \
  | sed "s/\"leases\"/\"dist-check-$$\"/" >"$check/quickstart.py"
(
  export PATH="$path"
  ! command -v cargo >/dev/null || { echo "dist: cargo still on PATH" >&2; exit 1; }
  "$check/venv/bin/pip" install -q "$wheel"
  cd "$check"
  venv/bin/python -c 'import leaselock, sys; assert leaselock.__version__ == sys.argv[1], leaselock.__version__' "$version"
  for run in 1 2; do
    venv/bin/python quickstart.py >/dev/null
  done
  echo "dist: the wheel installs into a scratch venv and the manual's Python sample runs there twice"
)

# --- Node
scripts/build-wasm.sh
scripts/npm-pack-check.sh dist

# --- Rust (the crates' own checks: a build of the packaged sources, then the upload dry run)
cargo package -p leaselock --allow-dirty
cargo publish --dry-run --allow-dirty -p leaselock -p leaselock-cli
cp "${CARGO_TARGET_DIR:-target}"/package/leaselock-"$version".crate dist/
ls -l dist
