#!/usr/bin/env bash
# The commit a full `make bench` measures, and whether the tree differs from it, as JSON for
# bench/merge.py. Read before the run writes anything; what a run itself writes (bench/results,
# the report, its plots and the README's headline) does not count, so a run on a tree that holds
# the last run's uncommitted figures still measures the commit.
set -euo pipefail
cd "$(dirname "$0")/.."
changed="$(git status --porcelain --untracked-files=no -- . ':(exclude)bench/results' ':(exclude)bench/REPORT.md' \
  ':(exclude)bench/*.png' ':(exclude)README.md')"
clean=$([[ -z "$changed" ]] && echo true || echo false)
echo "{\"bench_commit\": \"$(git rev-parse --short HEAD)\", \"bench_tree_clean\": $clean}"
