#!/usr/bin/env bash
# Installs what the manual's build needs, each only when missing (safe to run repeatedly):
#   mdBook, the pinned version, built by `cargo install --locked` into target/docs-tools/bin
#     (about 2 minutes on 2 cores; only the search feature, no `serve`/`watch`);
#   Graphviz (`dot`, `neato`: the Debian package graphviz, about 10 s; needs root) for the diagrams.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
MDBOOK_VERSION=0.4.52
tools=target/docs-tools

if [[ "$("$tools/bin/mdbook" --version 2>/dev/null)" != "mdbook v$MDBOOK_VERSION" ]]; then
  echo "docs-tools: cargo install mdbook $MDBOOK_VERSION into $tools"
  cargo install -q --locked mdbook --version "$MDBOOK_VERSION" --no-default-features --features search \
    --root "$tools"
fi

if ! command -v dot >/dev/null || ! command -v neato >/dev/null; then
  echo "docs-tools: installing graphviz"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq graphviz >/dev/null
fi
