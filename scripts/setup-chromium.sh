#!/usr/bin/env bash
# Test set-up: headless Chromium for the `hotreload report` picture test
# (tests/test_report.py), from Debian's package, only where it is absent and apt can install
# it. Never fails: without Chromium that one test skips and says why.
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  exit 0
fi
echo "setting up tests: installing Debian's chromium (headless, for the report picture test;" \
  "about a minute the first time)" >&2
{ apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
    --no-install-recommends chromium; } >/dev/null 2>&1 \
  || echo "chromium could not be installed: the report picture test will skip" >&2
exit 0
