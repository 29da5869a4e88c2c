#!/usr/bin/env bash
# make docs: the manual and the API reference of each language, into target/docs/:
#   index.html ...  the manual (mdBook, from docs/src/; scripts/install-docs-tools.sh installs
#                   mdBook and Graphviz when missing; its CLI reference is the --help of every
#                   command of the CLI as built, scripts/cli-reference.py);
#   diagrams/       its diagrams, SVG, rendered by Graphviz from docs/diagrams/ (*.dot with dot,
#                   *.seq sequence diagrams through scripts/seq2dot.py and neato);
#   rust/           rustdoc of the leaselock crate (its examples are doc tests, run by make test-rust);
#   python/         pdoc of the `leaselock` package (docstrings, with the .pyi stubs' signatures);
#   node/           TypeDoc of bindings/wasm/index.d.ts (the package's types and their comments).
# Then every link and image of the manual is checked (scripts/docs-links.py).
# `scripts/docs.sh --manual` builds and checks the manual and its diagrams alone (make test-docs),
# linking the API references without building them.
# The tools go into .venv and target/docs-tools; nothing is installed globally but Graphviz.
# Prints where each index page is.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=target/docs
manual_only=0
[[ ${1:-} == --manual ]] && manual_only=1
rm -rf "$out"
mkdir -p "$out"

echo "docs: manual"
scripts/install-docs-tools.sh
# The CLI reference page includes every command's --help, from the CLI as built.
cargo build -q -p leaselock-cli
mkdir -p target/docs-cli
scripts/cli-reference.py target/debug/leaselock >target/docs-cli/commands.md
target/docs-tools/bin/mdbook build -d "$PWD/$out" docs 2>&1 | { grep -v ' \[INFO\] ' || true; }
[[ -s $out/index.html ]] || { echo "docs: mdbook wrote no index.html" >&2; exit 1; }
mkdir -p "$out/diagrams"
for src in docs/diagrams/*.dot; do
  dot -Tsvg "$src" -o "$out/diagrams/$(basename "${src%.dot}").svg"
done
for src in docs/diagrams/*.seq; do
  scripts/seq2dot.py "$src" | neato -n2 -Tsvg -o "$out/diagrams/$(basename "${src%.seq}").svg"
done

if ((manual_only)); then
  # The API references' index pages, as placeholders the link check can find.
  for page in rust/leaselock/index.html python/leaselock.html node/index.html; do
    mkdir -p "$(dirname "$out/$page")"
    echo '<!doctype html><title>built by make docs</title>' >"$out/$page"
  done
else
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
fi

python3 scripts/docs-links.py "$out"
for page in "$out/index.html" "$out/rust/leaselock/index.html" "$out/python/leaselock.html" "$out/node/index.html"; do
  [[ -s $page ]] || { echo "docs: $page was not written" >&2; exit 1; }
  echo "docs: $page"
done
