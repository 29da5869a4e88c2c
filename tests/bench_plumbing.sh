#!/usr/bin/env bash
# The published figures come from one full `make bench`: a dry run writes nothing, a section run
# alone merges into bench/results/partial.json (never into the full run's latest.json), and the
# report names the commit the full run recorded, not the checkout it is written in.
set -euo pipefail
cd "$(dirname "$0")/.."
passed=0 failed=0
check() {
  if eval "$2"; then echo "ok     $1"; passed=$((passed + 1)); else echo "FAIL   $1"; failed=$((failed + 1)); fi
}

before="$(git status --porcelain)"
make -n bench >/dev/null
check "make -n bench writes nothing" '[[ "$(git status --porcelain)" == "$before" ]]'

# Where a section merges: make's own variable, read back by a make that only prints it.
section="$(make -s --eval 'where: ; @echo $$LEASELOCK_BENCH_RESULTS' where)"
full="$(make -s --eval 'where: ; @echo $$LEASELOCK_BENCH_RESULTS' where LEASELOCK_BENCH_RESULTS="$PWD/bench/results/latest.json")"
check "a section run alone merges into partial.json ($section)" '[[ "$section" == "$PWD/bench/results/partial.json" ]]'
check "the full run merges into latest.json" '[[ "$full" == "$PWD/bench/results/latest.json" ]]'

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
out="$(cd bench && python3 - "$scratch" <<'PY'
import sys
from pathlib import Path

sys.modules["matplotlib"] = type(sys)("matplotlib")  # the plots play no part here
sys.modules["matplotlib"].use = lambda *a, **k: None
sys.modules["matplotlib.pyplot"] = type(sys)("matplotlib.pyplot")
import report

readme = Path(sys.argv[1]) / "README.md"
readme.write_text(f"x\n{report.README_START}\nold\n{report.README_END}\n")
report.README = readme
report.update_readme({"bench_duration_s": 60})
print("partial:", "old" in readme.read_text())
report.update_readme({"bench_duration_s": 60, "bench_commit": "abc1234", "bench_tree_clean": True})
text = readme.read_text()
print("full:", "old" not in text and "commit `abc1234`" in text)
print("dirty:", report.bench_commit({"bench_commit": "abc1234"}))
PY
)"
check "figures without a full run's commit leave the README's headline alone" '[[ "$out" == *"partial: True"* ]]'
check "a full run's figures make the headline, naming its commit" '[[ "$out" == *"full: True"* ]]'
check "a run on a tree with uncommitted changes says so" '[[ "$out" == *"dirty: abc1234, with uncommitted changes"* ]]'

# The tree's state is read before the run deletes its last figures (a deleted latest.json made
# every full run say "with uncommitted changes"), and what a run writes does not count.
order="$(make -n bench | grep -n -e 'bench/tree-state.sh' -e 'rm -f bench/results/latest.json' | cut -d: -f2 | tr '\n' ' ')"
check "make bench reads the tree's state before it deletes the last figures" '[[ "$order" == "bench/tree-state.sh > target/bench-tree.json rm -f bench/results/latest.json " ]]'
repo="$scratch/repo"
mkdir -p "$repo/bench/results" "$repo/core"
cp bench/tree-state.sh "$repo/bench/"
for f in bench/results/latest.json bench/REPORT.md bench/cpu.png README.md core/lib.rs; do echo one >"$repo/$f"; done
git -C "$repo" init -q && git -C "$repo" add -A && git -C "$repo" -c user.name=t -c user.email=t@t commit -qm one
for f in bench/results/latest.json bench/REPORT.md bench/cpu.png README.md; do echo two >"$repo/$f"; done
state_outputs="$("$repo/bench/tree-state.sh")"
rm "$repo/bench/results/latest.json"
state_deleted="$("$repo/bench/tree-state.sh")"
echo two >"$repo/core/lib.rs"
state_code="$("$repo/bench/tree-state.sh")"
check "a tree whose only changes are the last run's figures is clean" '[[ "$state_outputs" == *"\"bench_tree_clean\": true}" && "$state_deleted" == *"true}" ]]'
check "a tree with a changed source file is not" '[[ "$state_code" == *"\"bench_tree_clean\": false}" ]]'

# The wasm section: part of the full run; it records its figures and fails over its limit. An
# empty module stands for the wasm, and the same with a custom section past the limit.
check "make bench runs the wasm section" '[[ "$(make -n bench-sections)" == *"node bindings/wasm/bench/size.js"* ]]'
limit="$(grep -o '^const WASM_LIMIT_BYTES = [0-9_]*' bindings/wasm/bench/size.js | tr -dc 0-9)"
python3 - "$scratch" "$limit" <<'PY'
import sys
from pathlib import Path

def leb(n: int) -> bytes:
    out = b""
    while True:
        byte, n = n & 0x7F, n >> 7
        out += bytes([byte | (0x80 if n else 0)])
        if not n:
            return out

header = b"\0asm\1\0\0\0"
name = b"padding"
payload = leb(len(name)) + name + b"\0" * (int(sys.argv[2]) + 1)
Path(sys.argv[1], "small.wasm").write_bytes(header)
Path(sys.argv[1], "large.wasm").write_bytes(header + b"\0" + leb(len(payload)) + payload)
PY
wasm_run() {
  LEASELOCK_BENCH_RESULTS="$scratch/wasm-$1.json" LEASELOCK_BENCH_WASM_LOADS=1 \
    node bindings/wasm/bench/size.js "$scratch/$1.wasm" >/dev/null 2>&1
}
check "the wasm section passes a wasm within its limit ($limit bytes)" 'wasm_run small'
check "and records its size, gzipped size, limit and load time" \
  '[[ "$(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(r[\"wasm_bytes\"], r[\"wasm_limit_bytes\"], *sorted(r))" "$scratch/wasm-small.json")" == "8 $limit wasm_bytes wasm_gzip_bytes wasm_limit_bytes wasm_load_ms wasm_loads" ]]'
check "the wasm section fails when the wasm is over its limit" '! wasm_run large'
wasm_report="$(cd bench && python3 - "$scratch/wasm-large.json" <<'PY'
import json
import sys

sys.modules["matplotlib"] = type(sys)("matplotlib")
sys.modules["matplotlib"].use = lambda *a, **k: None
sys.modules["matplotlib.pyplot"] = type(sys)("matplotlib.pyplot")
import report

r = json.load(open(sys.argv[1]))
print(report.wasm_section(r))
print("empty without figures:", report.wasm_section({}) == "")
PY
)"
check "the report shows the wasm over its limit, with its figures" '[[ "$wasm_report" == *"**over it**"* && "$wasm_report" == *"| limit | ${limit:0:1},"* && "$wasm_report" == *"empty without figures: True"* ]]'

echo "bench plumbing: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
