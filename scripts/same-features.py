#!/usr/bin/env python3
"""Checks that packages built for one run resolve every dependency they share with the same
features, so cargo builds that dependency (and everything above it, the AWS SDK included) once.

A crate's features are part of its build's identity: if `cargo build -p leaselock-cli` enables
a feature of, say, futures-util that `-p leaselock-python` does not, each gets its own build of
futures-util and of every crate that depends on it, the AWS SDK among them. `make demo` builds
the CLI and the Python binding one after the other, so this keeps them on one build.

Usage: scripts/same-features.py PACKAGE PACKAGE... (exit 1 and the differences when they differ)
"""
import subprocess
import sys


def features(package):
    """(name, version) -> the features cargo resolves for it when building `package` alone."""
    out = subprocess.run(
        ["cargo", "tree", "-q", "-p", package, "-e", "features,normal,build", "--prefix", "none",
         "-f", "{p} {f}"],
        check=True, capture_output=True, text=True).stdout
    resolved = {}
    for line in out.splitlines():
        parts = line.replace(" (*)", "").split()
        # Package lines are "name vX.Y.Z [features]"; feature nodes ("name feature ...") are skipped.
        if len(parts) < 2 or not parts[1].startswith("v"):
            continue
        tail = parts[2] if len(parts) > 2 and not parts[2].startswith("(") else ""
        resolved[(parts[0], parts[1])] = tail
    return resolved


def main(packages):
    if len(packages) < 2:
        sys.exit(__doc__.strip().splitlines()[-1])
    first, *rest = packages
    base = features(first)
    differ = 0
    for other in rest:
        theirs = features(other)
        for key in sorted(base.keys() & theirs.keys()):
            if base[key] != theirs[key]:
                differ += 1
                print(f"{key[0]} {key[1]}: {first} [{base[key]}] vs {other} [{theirs[key]}]")
    if differ:
        print(f"same-features: {differ} shared dependencies resolve differently; each is built twice, "
              "with everything that depends on it", file=sys.stderr)
        return 1
    print(f"same-features: {', '.join(packages)} share every common dependency's features")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
