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


def test_readme_examples_run() -> None:
    # A table of this run's own: the examples name "leases".
    name = unique("py-readme")
    ns: Dict[str, Any] = {"__name__": "__readme__"}
    sync, aio, worker, session = (code.replace('"leases"', repr(name)) for code in python_examples())
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
    table = ns["leaselock"].LeaseTable(name)
    assert all(table.get(id).expires_at_ms == 0 for id in ("stream-1", "stream-2"))

    exec(compile(session, "README.md (session)", "exec"), ns)
    stable = ns["leaselock"].LeaseTable(name, mode="session")
    assert [(s.owner, s.expires_at_ms) for s in stable.sessions()] == [("worker-a", 0)]
    assert table.get("stream-3").owner == "worker-a" and table.get("stream-3").last_seq == 1


def test_readme_election_example_runs(capsys: Any) -> None:
    (example,) = python_examples("Leader election")
    name = unique("py-readme-election")
    exec(compile(example.replace('"leases"', repr(name)), "README.md (election)", "exec"), {"__name__": "__readme__"})
    out = capsys.readouterr().out
    assert "monday's report under fence 1" in out
    assert "compacting under fence 1" in out
