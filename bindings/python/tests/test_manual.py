"""The manual's samples (docs/src/*.md), run as written against the local engine, twice in a
row on the same tables (a second run must not trip over what the first left):

- every ```python block, each in a process of its own, in page order;
- the Python package's README's ```python blocks too;
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
        source = ROOT / "core" / "examples" / f"{name}.rs"
        assert source.is_file(), (page, name)
        assert name.startswith("manual_") or name in RUST_EXAMPLES, f"{page}: {name} is run by no test"
        # The page shows the program from its first line of code: what it leaves out is the
        # file's header comment.
        first = re.search(r"\.rs:(\d+):", code)
        skipped = source.read_text().splitlines()[: int(first[1]) - 1] if first else []
        shown = source.read_text().splitlines()[len(skipped):]
        assert all(line.startswith("//") or not line.strip() for line in skipped), (page, name, skipped)
        assert shown and shown[0].startswith("use "), (page, name, shown[:1])


def test_manual_python_samples_run_twice() -> None:
    table = unique("py-manual")
    samples = blocks("python")
    for run in (1, 2):
        for i, (page, code) in enumerate(samples, 1):
            code = code.replace('"leases"', repr(table))
            done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
            assert done.returncode == 0, f"run {run}, {page} sample {i}:\n{code}\n--- stderr:\n{done.stderr}"
    print(f"{len(samples)} Python samples of the manual ran twice")


def test_the_python_packages_readme_samples_run_twice() -> None:
    """bindings/python/README.md's samples, the same way."""
    readme = ROOT / "bindings" / "python" / "README.md"
    samples = re.findall(r"^```python\n(.*?)^```$", readme.read_text(), flags=re.S | re.M)
    assert samples
    table = unique("py-package-readme")
    for run in (1, 2):
        for i, code in enumerate(samples, 1):
            code = code.replace('"leases"', repr(table))
            done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
            assert done.returncode == 0, f"run {run}, bindings/python/README.md sample {i}:\n{done.stderr}"


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


def _sources() -> str:
    """The code and templates the manual describes (not the docs themselves)."""
    roots = ["cli/src", "core/src", "lambdas/src", "bindings/python/python", "bindings/python/src",
             "bindings/wasm/lib", "bindings/wasm/src", "bindings/wasm/index.d.ts", "scripts", "examples",
             "infra/lib", "template.yaml", "Makefile"]
    text = []
    for root in roots:
        path = ROOT / root
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file() and p.suffix in
                                                 (".rs", ".py", ".pyi", ".js", ".mjs", ".ts", ".sh", ".yaml", "")]
        text += [f.read_text(errors="replace") for f in files if "node_modules" not in f.parts]
    return "\n".join(text)


def test_every_variable_flag_and_metric_the_manual_names_exists() -> None:
    """Every LEASELOCK_* variable the manual names is read somewhere in the code; every `--flag`
    it writes alone in backticks is a flag of the leaselock CLI; every worker metric in its
    table is one the worker writes."""
    text = "\n".join(page.read_text() for page in pages())
    sources = _sources()
    variables = set(re.findall(r"\bLEASELOCK_[A-Z_]+[A-Z]\b", text))
    missing = sorted(v for v in variables if v not in sources)
    assert not missing, f"variables the manual names that no code reads: {missing}"

    subprocess.run(["cargo", "build", "-q", "-p", "leaselock-cli"], cwd=ROOT, check=True, timeout=1800)
    meta = subprocess.run(["cargo", "metadata", "--format-version", "1", "--no-deps"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout
    cli = Path(json.loads(meta)["target_directory"]) / "debug" / "leaselock"
    top = subprocess.run([cli, "--help"], capture_output=True, text=True, check=True).stdout
    commands = re.findall(r"^  ([a-z][a-z-]+)\s", top.split("Commands:", 1)[1].split("Options:", 1)[0], flags=re.M)
    helps = top + "".join(subprocess.run([cli, c, "--help"], capture_output=True, text=True).stdout for c in commands)
    for sub in ("table",):
        helps += subprocess.run([cli, sub, "create", "--help"], capture_output=True, text=True).stdout
    flags = set(re.findall(r"`(--[a-z][a-z-]*)`", text))
    missing = sorted(f for f in flags if not re.search(rf"{re.escape(f)}\b", helps))
    assert not missing, f"flags the manual names that the CLI does not take: {missing}"

    operations = (PAGES / "operations.md").read_text()
    table = operations.split("| metric | unit | what |", 1)[1].split("\n\n", 1)[0]
    named = set(re.findall(r"^\| `(\w+)` \|", table, flags=re.M))
    emf = (ROOT / "core" / "src" / "engine" / "mod.rs").read_text()
    written = set(re.findall(r'\.(?:count|milliseconds|millisecond_value)\("(\w+)"', emf.split("pub fn emf_line", 1)[1].split("\n}\n", 1)[0]))
    assert named == written, (sorted(named - written), sorted(written - named))
    print(f"{len(variables)} variables, {len(flags)} flags and {len(named)} worker metrics checked")


def test_every_error_class_the_manual_names_exists() -> None:
    """The API page's error list: Rust variants of leaselock::Error, Python classes of the
    package, Node classes index.d.ts exports."""
    import leaselock

    text = (PAGES / "api-reference.md").read_text().split("\nErrors:", 1)[1]
    rust, rest = text.split("Python", 1)
    python, node = rest.split("Node", 1)
    names = lambda part: set(re.findall(r"`(?:leaselock[.:]+)?(\w+)`", part))  # noqa: E731
    error_rs = (ROOT / "core" / "src" / "error.rs").read_text()
    variants = set(re.findall(r"^    ([A-Z]\w*)\b", error_rs.split("pub enum Error", 1)[1].split("\n}\n", 1)[0], flags=re.M))
    assert names(rust) - {"Error"} <= variants, names(rust) - {"Error"} - variants
    assert all(isinstance(getattr(leaselock, n, None), type) for n in names(python)), \
        [n for n in names(python) if not isinstance(getattr(leaselock, n, None), type)]
    dts = (ROOT / "bindings" / "wasm" / "index.d.ts").read_text()
    exported = set(re.findall(r"export declare class (\w+)", dts)) | set(re.findall(r"export \{ \w+ as (\w+) \}", dts))
    assert names(node) - {"Error"} <= exported, names(node) - {"Error"} - exported


def test_infra_readme_lists_every_worker_metric() -> None:
    infra = (ROOT / "infra" / "README.md").read_text()
    listed = infra.split("A worker's are published under", 1)[1].split("Counts are deltas", 1)[0]
    emf = (ROOT / "core" / "src" / "engine" / "mod.rs").read_text()
    written = set(re.findall(r'\.(?:count|milliseconds|millisecond_value)\("(\w+)"', emf.split("pub fn emf_line", 1)[1].split("\n}\n", 1)[0]))
    named = set(re.findall(r"`([A-Z]\w+)`", listed)) - {"Service", "WorkerId", "ClockOffsetAlarm"}
    assert named == written, (sorted(named - written), sorted(written - named))
