#!/usr/bin/env bash
# make docs: the API reference of each language, from the sources users read, into target/docs/:
#   rust/    rustdoc of the leaselock crate (its examples are doc tests, run by make test-rust);
#   python/  pdoc of the `leaselock` package (docstrings, with the .pyi stubs' signatures);
#   node/    TypeDoc of bindings/wasm/index.d.ts (the package's types and their comments).
# The tools go into .venv and target/docs-tools; nothing is installed globally. Prints where
# each language's index page is.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=target/docs
rm -rf "$out"
mkdir -p "$out"

echo "docs: rust"
RUSTDOCFLAGS="-D warnings" cargo doc -q --no-deps -p leaselock
cp -r target/doc "$out/rust"

echo "docs: python"
scripts/python-binding.sh
.venv/bin/python -c 'import pdoc' 2>/dev/null || .venv/bin/pip install -q 'pdoc>=15,<16'
.venv/bin/pdoc -o "$out/python" leaselock

echo "docs: node"
tools=target/docs-tools
if [[ ! -x $tools/node_modules/.bin/typedoc ]]; then
  npm install -s --no-audit --no-fund --prefix "$tools" typedoc@0.28 typescript@5 >/dev/null
fi
(cd bindings/wasm && "../../$tools/node_modules/.bin/typedoc" --logLevel Warn --readme README.md \
  --skipErrorChecking --disableSources --out "../../$out/node" index.d.ts 2>&1) || {
  echo "docs: typedoc failed" >&2
  exit 1
}

for page in "$out/rust/leaselock/index.html" "$out/python/leaselock.html" "$out/node/index.html"; do
  [[ -s $page ]] || { echo "docs: $page was not written" >&2; exit 1; }
  echo "docs: $page"
done
