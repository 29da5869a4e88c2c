"""The manual's samples (docs/src/*.md), run as written against the local engine, twice in a
row on the same tables (a second run must not trip over what the first left):

- every ```python block, each in a process of its own, in page order, but for a block marked
  `<!-- runs until SIGTERM ... -->`, which runs here in a test of its own that sends the signal;
- the API page's Python samples, the election page's and the Rust samples that talk to the
  engine again, with what they print and write checked (the worker ones until SIGTERM);
- the Python package's README's ```python blocks too;
- every ```rust block is an include of an example program of the crate (core/examples/): the
  manual_* ones are built and run twice here as they are, the sample_* ones with their output
  checked (RUST_SAMPLES).

The Node blocks run in bindings/wasm/tests/manual.test.js. A table name "leases" (and
"session-leases") in a sample is replaced by one of this run's own. The repository's README holds
no sample of its own: the manual's are the ones that run.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Dict, List, Tuple

from conftest import unique, wait_for

ROOT = Path(__file__).resolve().parents[3]
PAGES = ROOT / "docs" / "src"
INCLUDE = re.compile(r"\{\{#include \.\./\.\./core/examples/(\w+)\.rs(?::[0-9:]*)?\}\}")
# The Rust samples that talk to the engine, run with their output checked (below).
RUST_SAMPLES = ["sample_table", "sample_worker", "sample_election"]


def pages() -> List[Path]:
    """The pages in the book's order (SUMMARY.md)."""
    summary = (PAGES / "SUMMARY.md").read_text()
    return [PAGES / name for name in re.findall(r"\]\((\w[\w-]*\.md)\)", summary)]


def fenced(text: str, lang: str) -> List[Tuple[bool, str]]:
    """The ```lang blocks of a Markdown text: (marked to run until SIGTERM, code)."""
    return [(bool(mark), code) for mark, code in
            re.findall(rf"^(<!-- runs until SIGTERM[^\n]*-->\n)?```{lang}\n(.*?)^```$", text, flags=re.S | re.M)]


def blocks(lang: str) -> List[Tuple[str, str]]:
    """Every ```lang block of the manual that runs on its own: (page, code)."""
    return [(page.name, code) for page in pages() for mark, code in fenced(page.read_text(), lang) if not mark]


def section(page: str, heading: str) -> str:
    text = (PAGES / page).read_text()
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def python_samples(page: str, heading: str) -> List[str]:
    return [code for _, code in fenced(section(page, heading), "python")]


def test_the_readme_leaves_its_samples_to_the_manual() -> None:
    readme = (ROOT / "README.md").read_text()
    langs = re.findall(r"^```(\w+)", readme, flags=re.M)
    assert not set(langs) & {"rust", "python", "js", "javascript", "ts"}, langs


def test_the_manual_has_samples_in_every_language() -> None:
    counts = {lang: len(blocks(lang)) for lang in ("python", "js", "rust")}
    print(f"manual samples: {counts}")
    assert all(n > 0 for n in counts.values()), counts


def test_every_rust_sample_is_an_example_that_runs() -> None:
    included = set()
    for page, code in blocks("rust"):
        m = INCLUDE.fullmatch(code.strip())
        assert m, f"{page}: a Rust sample must be an include of core/examples/*.rs, built and run by the tests"
        name = m[1]
        source = ROOT / "core" / "examples" / f"{name}.rs"
        assert source.is_file(), (page, name)
        assert name.startswith("manual_") or name in RUST_SAMPLES, f"{page}: {name} is run by no test"
        included.add(name)
        # The page shows the program from its first line of code: what it leaves out is the
        # file's header comment.
        first = re.search(r"\.rs:(\d+):", code)
        skipped = source.read_text().splitlines()[: int(first[1]) - 1] if first else []
        shown = source.read_text().splitlines()[len(skipped):]
        assert all(line.startswith("//") or not line.strip() for line in skipped), (page, name, skipped)
        assert shown and shown[0].startswith("use "), (page, name, shown[:1])
    # ... and every sample program is shown on some page.
    programs = {p.stem for p in (ROOT / "core" / "examples").glob("*.rs")}
    samples = {n for n in programs if n.startswith(("manual_", "sample_"))}
    assert samples == included, (sorted(samples - included), sorted(included - samples))
    assert set(RUST_SAMPLES) <= included


def test_manual_python_samples_run_twice() -> None:
    table, session_table = unique("py-manual"), unique("py-manual-session")
    samples = blocks("python")
    for run in (1, 2):
        for i, (page, code) in enumerate(samples, 1):
            code = code.replace('"leases"', repr(table)).replace('"session-leases"', repr(session_table))
            done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
            assert done.returncode == 0, f"run {run}, {page} sample {i}:\n{code}\n--- stderr:\n{done.stderr}"
    print(f"{len(samples)} Python samples of the manual ran twice")


# The API page's Python samples, the election page's and the Rust samples that talk to the
# engine: run twice with what they print and write checked (the worker ones until SIGTERM).
API_PAGE = "api-reference.md"


def test_the_api_page_has_its_python_samples() -> None:
    samples = fenced(section(API_PAGE, "Python"), "python")
    assert len(samples) == 4, len(samples)
    # The one sample that runs until SIGTERM is the worker's, run below; no other page has one.
    marked = [(page.name, code) for page in pages() for mark, code in fenced(page.read_text(), "python") if mark]
    assert marked == [(API_PAGE, samples[2][1])], marked


def run_api_samples(table: str, session_table: str) -> None:
    """The API page's four Python samples in order, as written but for the table names."""
    import leaselock

    ns: Dict[str, Any] = {"__name__": "__manual__"}
    names = {'"leases"': repr(table), '"session-leases"': repr(session_table)}
    sync, aio, worker, session = python_samples(API_PAGE, "Python")
    for old, new in names.items():
        sync, aio, worker, session = (code.replace(old, new) for code in (sync, aio, worker, session))
    exec(compile(sync, f"{API_PAGE} (sync)", "exec"), ns)
    exec(compile(aio, f"{API_PAGE} (asyncio)", "exec"), ns)

    # The worker sample runs until SIGTERM: send one once it holds both streams and each of its
    # handlers has checkpointed.
    leases = leaselock.LeaseTable(table)
    before = {id: leases.get(id).last_seq or 0 for id in ("stream-1", "stream-2")}

    def terminate() -> None:
        wait_for(lambda: "worker" in ns, 10, "the worker")
        wait_for(lambda: len(ns["worker"].snapshot().held) == 2, 15, "both streams claimed")
        wait_for(lambda: all((leases.get(id).last_seq or 0) > seq for id, seq in before.items()), 15,
                 "a checkpoint of each stream by the worker's handlers")
        os.kill(os.getpid(), signal.SIGTERM)

    killer = threading.Thread(target=terminate, daemon=True)
    killer.start()
    exec(compile(worker, f"{API_PAGE} (worker)", "exec"), ns)
    killer.join()
    assert ns["last"].released == 2
    assert all(leases.get(id).expires_at_ms == 0 for id in ("stream-1", "stream-2"))

    exec(compile(session, f"{API_PAGE} (session)", "exec"), ns)
    sessions = leaselock.LeaseTable(session_table, mode="session")
    assert [s.expires_at_ms for s in sessions.sessions() if s.owner == "worker-a"][-1] == 0
    assert sessions.get("stream-3").owner == "worker-a"
    # The session sample keeps to its own table.
    assert leases.get("stream-3") is None


def test_api_page_python_samples_run_twice() -> None:
    # Tables of this run's own (the samples name "leases" and "session-leases"), each used by
    # both runs: a second run must not trip over what the first left (a checkpoint, a holder).
    table, session_table = unique("py-api"), unique("py-api-session")
    run_api_samples(table, session_table)
    first = api_checkpoints(table, session_table)
    run_api_samples(table, session_table)
    second = api_checkpoints(table, session_table)
    for id, seq in first.items():
        assert second[id] > seq, (id, seq, second[id])


def api_checkpoints(table: str, session_table: str) -> Dict[str, int]:
    """The checkpoints the samples moved: they go forward on every run."""
    import leaselock

    leases = leaselock.LeaseTable(table)
    seqs = {id: leases.get(id).last_seq or 0 for id in ("stream-1", "stream-2", "leader")}
    seqs["stream-3"] = leaselock.LeaseTable(session_table, mode="session").get("stream-3").last_seq or 0
    return seqs


def test_election_page_python_sample_runs_twice(capsys: Any) -> None:
    (sample,) = python_samples("election.md", "Python")
    name = unique("py-election")
    for fence in (1, 2):
        code = compile(sample.replace('"leases"', repr(name)), "election.md (Python)", "exec")
        exec(code, {"__name__": "__manual__"})
        out = capsys.readouterr().out
        assert f"monday's report under fence {fence}" in out
        assert f"compacting under fence {fence}" in out


def _example_binaries(names: List[str]) -> Dict[str, Path]:
    subprocess.run(["cargo", "build", "-q", "-p", "leaselock", "--examples"], cwd=ROOT, check=True, timeout=1800)
    meta = subprocess.run(["cargo", "metadata", "--format-version", "1", "--no-deps"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout
    target = Path(json.loads(meta)["target_directory"])
    return {name: target / "debug" / "examples" / name for name in names}


def test_rust_samples_run_twice() -> None:
    """The samples on the engine's own table name, "leases": the lease by hand and the worker of
    the quick start, the election of its page."""
    import leaselock

    binaries = _example_binaries(RUST_SAMPLES)
    table = leaselock.LeaseTable("leases")
    for run in (1, 2):
        done = subprocess.run([binaries["sample_table"]], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (run, done.stderr)
        assert re.fullmatch(r"fence \d+, resume after (None|Some\(\d+\))\n", done.stdout), (run, done.stdout)
        seq = table.get("stream-1").last_seq
        assert seq is not None and seq >= run, (run, seq)

        # The worker runs until SIGTERM: send it once it has claimed the released stream-1.
        worker = subprocess.Popen([binaries["sample_worker"]], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            wait_for(lambda: table.get("stream-1").expires_at_ms > 0, 30, "the worker's claim of stream-1")
        finally:
            worker.send_signal(signal.SIGTERM)
            out, err = worker.communicate(timeout=60)
        assert worker.returncode == 0, (run, err)
        assert re.search(r"^released [1-9]\d*$", err, flags=re.M), (run, err)
        assert table.get("stream-1").expires_at_ms == 0

        elected = subprocess.run([binaries["sample_election"]], capture_output=True, text=True, timeout=120)
        assert elected.returncode == 0, (run, elected.stderr)
        # The sample keeps its term at least min_lease (60 s): run again within it (the second
        # run, or the first on an engine a previous test run left running), it skips.
        want = r"ran under fence \d+\n|skipped: Some\(\"host-a\"\) leads\n"
        assert re.fullmatch(want, elected.stdout), (run, elected.stdout)


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
    binaries = _example_binaries(names)
    for run in (1, 2):
        for name in names:
            done = subprocess.run([binaries[name]], capture_output=True, text=True, timeout=120)
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


def test_the_readmes_names_across_languages_are_the_codes() -> None:
    """Every name of the README's table of names across languages is one its language defines:
    Rust a function, field or type of core, Python an attribute of the package's classes or an
    argument of their constructors, Node a member or type of index.d.ts. (Spans after `→` or
    `:` are types, and spans that are not plain names, such as `time.monotonic()`, are prose.)"""
    import inspect

    import leaselock

    readme = (ROOT / "README.md").read_text()
    table = readme.split("\n## Names across languages\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| what")]
    assert len(rows) == 10, rows

    rust = "\n".join(f.read_text() for f in (ROOT / "core" / "src").rglob("*.rs"))
    node = (ROOT / "bindings" / "wasm" / "index.d.ts").read_text()
    python = set(dir(leaselock))
    for cls in (leaselock.LeaseTable, leaselock.AsyncLeaseTable, leaselock.Lease, leaselock.AsyncLease,
                leaselock.Session, leaselock.Worker, leaselock.Connection, leaselock.Term):
        python |= set(dir(cls))
    for cls in (leaselock.LeaseTable, leaselock.AsyncLeaseTable, leaselock.Worker):
        python |= set(inspect.signature(cls.__init__).parameters)

    def defined(lang: str, name: str) -> bool:
        n = re.escape(name)
        if lang == "rust":
            return re.search(rf"\b(?:fn|struct|enum|trait)\s+{n}\b|\bpub\s+{n}\s*:", rust) is not None
        if lang == "python":
            return name in python
        return re.search(rf"\b{n}\??\s*[:(]|\b(?:class|interface|type)\s+{n}\b", node) is not None

    checked = 0
    for row in rows:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]]
        assert len(cells) == 4, row
        for lang, cell in zip(("rust", "python", "node"), cells[1:]):
            for before, span in re.findall(r"(→ |: |^|[^`]*?)`([^`]+)`", cell):
                if before.endswith(("→ ", ": ")) or not re.fullmatch(r"[A-Za-z_]\w*(?:::[A-Za-z_]\w*)?", span):
                    continue
                for name in span.split("::"):
                    assert defined(lang, name), f"{lang} has no {name!r} (README, {cells[0]!r})"
                    checked += 1
    assert checked >= 40, checked


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
    emf = (ROOT / "core" / "src" / "engine" / "report.rs").read_text()
    written = set(re.findall(r'\.(?:count|milliseconds|millisecond_value)\("(\w+)"', emf.split("pub fn emf_line", 1)[1].split("\n}\n", 1)[0]))
    assert named == written, (sorted(named - written), sorted(written - named))
    print(f"{len(variables)} variables, {len(flags)} flags and {len(named)} worker metrics checked")


def test_every_error_class_the_manual_names_exists() -> None:
    """The API page's error list: Rust variants of leaselock::Error, Python classes of the
    package, Node classes index.d.ts exports."""
    import leaselock

    text = (PAGES / "api-reference.md").read_text().split("\nErrors:", 1)[1].split("\n\n", 1)[0]
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
    emf = (ROOT / "core" / "src" / "engine" / "report.rs").read_text()
    written = set(re.findall(r'\.(?:count|milliseconds|millisecond_value)\("(\w+)"', emf.split("pub fn emf_line", 1)[1].split("\n}\n", 1)[0]))
    named = set(re.findall(r"`([A-Z]\w+)`", listed)) - {"Service", "WorkerId", "ClockOffsetAlarm"}
    assert named == written, (sorted(named - written), sorted(written - named))
