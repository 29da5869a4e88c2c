#!/usr/bin/env python3
"""The manual's CLI reference, from the CLI itself: every command's `--help` (the global table
options once, under the top-level command), as Markdown on stdout. scripts/docs.sh writes it to
target/docs-cli/commands.md, which docs/src/cli.md includes, so the page always matches the code.

    scripts/cli-reference.py target/debug/leaselock
"""
import re
import subprocess
import sys

cli = sys.argv[1]
# Without LEASELOCK_* (or AWS) variables: `[env: X=value]` would show this shell's values.
ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "COLUMNS": "100"}


def help_of(*args: str) -> str:
    done = subprocess.run([cli, *args, "--help"], capture_output=True, text=True, env=ENV, check=True)
    return done.stdout.rstrip()


def commands(text: str) -> list:
    block = text.split("Commands:", 1)[1].split("Options:", 1)[0] if "Commands:" in text else ""
    return [c for c in re.findall(r"^  ([a-z][a-z-]*)\s", block, flags=re.M) if c != "help"]


def options(text: str) -> list:
    """The option blocks of a help text: (flag, lines)."""
    blocks, current = [], None
    for line in text.split("Options:", 1)[1].splitlines() if "Options:" in text else []:
        # A flag's first line is indented 2 (`  -h, --help`) or 6 (`      --url <URL>`) spaces; its
        # description 10.
        m = re.match(r"^ {2,6}(?:-\w, )?(--[a-z][a-z-]*)|^  (-\w)\b", line)
        if m:
            current = (m[1] or m[2], [line])
            blocks.append(current)
        elif current is not None:
            current[1].append(line)
    return blocks


def without(text: str, flags: set) -> str:
    """`text` without the option blocks of `flags` (the global ones, shown once)."""
    if "Options:" not in text:
        return text
    head = text.split("Options:", 1)[0]
    kept = [lines for flag, lines in options(text) if flag not in flags]
    body = "\n".join("\n".join(lines).rstrip("\n") for lines in kept)
    return (head + "Options:\n" + body).rstrip() + ("\n\n(and the table options of `leaselock` above; --help, --version)" if flags else "")


top = help_of()
# Shown once, under the top-level command (with --help and --version).
globals_ = {flag for flag, _ in options(top)}
out = ["## leaselock", "", "```text", top, "```", ""]
for command in commands(top):
    text = help_of(command)
    out += [f"## leaselock {command}", "", "```text", without(text, globals_), "```", ""]
    for sub in commands(text):
        out += [f"### leaselock {command} {sub}", "", "```text", without(help_of(command, sub), globals_), "```", ""]
print("\n".join(out))
