"""The manual's samples (docs/src/*.md), run as written against the local engine, twice in a
row on the same tables (a second run must not trip over what the first left):

- every ```python block, each in a process of its own, in page order;
- every ```rust block is an include of an example program of the crate (core/examples/): the
  manual_* ones are built and run twice here, the readme_* ones by test_readme.py.

The Node blocks run in bindings/wasm/tests/manual.test.js. A table name "leases" in a sample is
replaced by one of this run's own.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

from conftest import unique

ROOT = Path(__file__).resolve().parents[3]
PAGES = ROOT / "docs" / "src"
INCLUDE = re.compile(r"\{\{#include \.\./\.\./core/examples/(\w+)\.rs(?::[0-9:]*)?\}\}")


def pages() -> List[Path]:
    """The pages in the book's order (SUMMARY.md)."""
    summary = (PAGES / "SUMMARY.md").read_text()
    return [PAGES / name for name in re.findall(r"\]\((\w[\w-]*\.md)\)", summary)]


def blocks(lang: str) -> List[Tuple[str, str]]:
    found = []
    for page in pages():
        for code in re.findall(rf"^```{lang}\n(.*?)^```$", page.read_text(), flags=re.S | re.M):
            found.append((page.name, code))
    return found


def test_the_manual_has_samples_in_every_language() -> None:
    counts = {lang: len(blocks(lang)) for lang in ("python", "js", "rust")}
    print(f"manual samples: {counts}")
    assert all(n > 0 for n in counts.values()), counts


def test_every_rust_sample_is_an_example_that_runs() -> None:
    from test_readme import RUST_EXAMPLES

    for page, code in blocks("rust"):
        m = INCLUDE.fullmatch(code.strip())
        assert m, f"{page}: a Rust sample must be an include of core/examples/*.rs, built and run by the tests"
        name = m[1]
        assert (ROOT / "core" / "examples" / f"{name}.rs").is_file(), (page, name)
        assert name.startswith("manual_") or name in RUST_EXAMPLES, f"{page}: {name} is run by no test"


def test_manual_python_samples_run_twice() -> None:
    table = unique("py-manual")
    samples = blocks("python")
    for run in (1, 2):
        for i, (page, code) in enumerate(samples, 1):
            code = code.replace('"leases"', repr(table))
            done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
            assert done.returncode == 0, f"run {run}, {page} sample {i}:\n{code}\n--- stderr:\n{done.stderr}"
    print(f"{len(samples)} Python samples of the manual ran twice")


def test_manual_rust_samples_run_twice() -> None:
    names = sorted({INCLUDE.fullmatch(code.strip())[1] for _, code in blocks("rust")
                    if INCLUDE.fullmatch(code.strip()) and INCLUDE.fullmatch(code.strip())[1].startswith("manual_")})
    assert names
    subprocess.run(["cargo", "build", "-q", "-p", "leaselock", "--examples"], cwd=ROOT, check=True, timeout=1800)
    meta = subprocess.run(["cargo", "metadata", "--format-version", "1", "--no-deps"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout
    target = Path(json.loads(meta)["target_directory"])
    for run in (1, 2):
        for name in names:
            done = subprocess.run([target / "debug" / "examples" / name], capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, f"run {run}, core/examples/{name}.rs:\n{done.stderr}"
    print(f"{len(names)} Rust samples of the manual ran twice: {names}")
