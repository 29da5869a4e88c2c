"""The README's Python examples, executed against the local engine."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any, Dict, List

from conftest import unique, wait_for

README = Path(__file__).resolve().parents[3] / "README.md"


def python_examples(heading: str = "Python") -> List[str]:
    text = README.read_text()
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_the_readme_has_the_examples() -> None:
    assert len(python_examples()) == 4


def run_examples(table: str, session_table: str) -> None:
    """The four examples in order, as written but for the table names."""
    ns: Dict[str, Any] = {"__name__": "__readme__"}
    names = {'"leases"': repr(table), '"session-leases"': repr(session_table)}
    sync, aio, worker, session = python_examples()
    for old, new in names.items():
        sync, aio, worker, session = (code.replace(old, new) for code in (sync, aio, worker, session))
    exec(compile(sync, "README.md (sync)", "exec"), ns)
    exec(compile(aio, "README.md (asyncio)", "exec"), ns)

    # The worker example runs until SIGTERM: send one once it holds both streams.
    def terminate() -> None:
        wait_for(lambda: "worker" in ns, 10, "the worker")
        wait_for(lambda: len(ns["worker"].snapshot().held) == 2, 15, "both streams claimed")
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGTERM)

    killer = threading.Thread(target=terminate, daemon=True)
    killer.start()
    exec(compile(worker, "README.md (worker)", "exec"), ns)
    killer.join()
    assert ns["last"].released == 2
    leases = ns["leaselock"].LeaseTable(table)
    assert all(leases.get(id).expires_at_ms == 0 for id in ("stream-1", "stream-2"))

    exec(compile(session, "README.md (session)", "exec"), ns)
    sessions = ns["leaselock"].LeaseTable(session_table, mode="session")
    assert [s.expires_at_ms for s in sessions.sessions() if s.owner == "worker-a"][-1] == 0
    assert sessions.get("stream-3").owner == "worker-a"
    # The session example keeps to its own table.
    assert leases.get("stream-3") is None


def test_readme_examples_run_twice() -> None:
    # Tables of this run's own (the examples name "leases" and "session-leases"), each used by
    # both runs: a second run must not trip over what the first left (a checkpoint, a holder).
    table, session_table = unique("py-readme"), unique("py-readme-session")
    run_examples(table, session_table)
    first = checkpoints(table, session_table)
    run_examples(table, session_table)
    second = checkpoints(table, session_table)
    for id, seq in first.items():
        assert second[id] > seq, (id, seq, second[id])


def checkpoints(table: str, session_table: str) -> Dict[str, int]:
    """The checkpoints the examples moved: they go forward on every run."""
    import leaselock

    leases = leaselock.LeaseTable(table)
    seqs = {id: leases.get(id).last_seq or 0 for id in ("stream-1", "stream-2", "leader")}
    seqs["stream-3"] = leaselock.LeaseTable(session_table, mode="session").get("stream-3").last_seq or 0
    return seqs


def test_readme_election_example_runs_twice(capsys: Any) -> None:
    (example,) = python_examples("Leader election")
    name = unique("py-readme-election")
    for fence in (1, 2):
        code = compile(example.replace('"leases"', repr(name)), "README.md (election)", "exec")
        exec(code, {"__name__": "__readme__"})
        out = capsys.readouterr().out
        assert f"monday's report under fence {fence}" in out
        assert f"compacting under fence {fence}" in out


# The README's Rust examples: core/examples/readme_*.rs are verbatim copies (checked here), built
# once and run twice each on the README's own table name, "leases", of the local engine.
ROOT = README.parent
RUST_EXAMPLES = ["readme_table", "readme_worker", "readme_election"]


def rust_examples() -> List[str]:
    return re.findall(r"```rust,no_run\n(.*?)```", README.read_text(), flags=re.S)


def test_the_rust_examples_are_the_readmes() -> None:
    blocks = rust_examples()
    assert len(blocks) == len(RUST_EXAMPLES)
    for name, block in zip(RUST_EXAMPLES, blocks):
        copy = (ROOT / "core" / "examples" / f"{name}.rs").read_text()
        assert copy.split("\n\n", 1)[1] == block, f"core/examples/{name}.rs differs from the README"


def _rust_example_binaries() -> Dict[str, Path]:
    import json
    import subprocess

    subprocess.run(["cargo", "build", "-q", "-p", "leaselock", "--examples"], cwd=ROOT, check=True, timeout=1800)
    meta = subprocess.run(["cargo", "metadata", "--format-version", "1", "--no-deps"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout
    target = Path(json.loads(meta)["target_directory"])
    return {name: target / "debug" / "examples" / name for name in RUST_EXAMPLES}


def test_readme_rust_examples_run_twice() -> None:
    import subprocess

    import leaselock

    binaries = _rust_example_binaries()
    table = leaselock.LeaseTable("leases")
    for run in (1, 2):
        done = subprocess.run([binaries["readme_table"]], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (run, done.stderr)
        assert re.fullmatch(r"fence \d+, resume after (None|Some\(\d+\))\n", done.stdout), (run, done.stdout)
        seq = table.get("stream-1").last_seq
        assert seq is not None and seq >= run, (run, seq)

        # The worker runs until SIGTERM: send it once it has claimed the released stream-1.
        worker = subprocess.Popen([binaries["readme_worker"]], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            wait_for(lambda: table.get("stream-1").expires_at_ms > 0, 30, "the worker's claim of stream-1")
        finally:
            worker.send_signal(signal.SIGTERM)
            out, err = worker.communicate(timeout=60)
        assert worker.returncode == 0, (run, err)
        assert re.search(r"^released [1-9]\d*$", err, flags=re.M), (run, err)
        assert table.get("stream-1").expires_at_ms == 0

        elected = subprocess.run([binaries["readme_election"]], capture_output=True, text=True, timeout=120)
        assert elected.returncode == 0, (run, elected.stderr)
        # The example keeps its term at least min_lease (60 s): run again within it (the second
        # run, or the first on an engine a previous test run left running), it skips.
        want = r"ran under fence \d+\n|skipped: Some\(\"host-a\"\) leads\n"
        assert re.fullmatch(want, elected.stdout), (run, elected.stdout)
