#!/usr/bin/env bash
# libfaketime for the tests that run a process with its wall clock shifted (cli/tests/clock.rs):
#   scripts/faketime.sh          install the Debian package if missing; print the library's path
# Run a command on a shifted wall clock, the monotonic clock untouched:
#   LD_PRELOAD="$(scripts/faketime.sh)" FAKETIME="+5s" FAKETIME_DONT_FAKE_MONOTONIC=1 command
set -euo pipefail

find_lib() {
  find /usr/lib /usr/local/lib -name libfaketime.so.1 -path '*faketime*' 2>/dev/null | sort | head -n 1
}

lib="$(find_lib)"
if [[ -z "$lib" ]]; then
  echo "faketime: installing libfaketime" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libfaketime >/dev/null
  lib="$(find_lib)"
fi
if [[ -z "$lib" ]]; then
  echo "faketime: libfaketime.so.1 not found after installing libfaketime" >&2
  exit 1
fi
echo "$lib"
