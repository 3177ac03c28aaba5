#!/usr/bin/env bash
# Installs Debian's Chromium for the explorer page's browser tests (tests/serve), once.
# Playwright drives it through executable_path=/usr/bin/chromium: Playwright's own browser
# download needs the open internet, which CI does not have; Debian's package mirror it has.
# Idempotent: does nothing when /usr/bin/chromium is already there. Needs root for apt-get;
# without root (a developer's laptop) it says so and carries on, and the browser tests skip.
set -euo pipefail

if [ -x /usr/bin/chromium ]; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "install-browser: not root, so not installing chromium; the browser tests will be skipped" >&2
    exit 0
fi
if ! command -v apt-get >/dev/null; then
    echo "install-browser: no apt-get here; install Chromium at /usr/bin/chromium for the browser tests" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
echo "install-browser: installing Debian's chromium and fonts-dejavu-core with apt-get, once, for the explorer page's browser tests" >&2
for attempt in 1 2 3; do  # a registry hiccup should not fail the whole test run
    if apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null; then
        break
    fi
    [ "$attempt" = 3 ] && { echo "install-browser: apt-get failed three times" >&2; exit 1; }
    sleep 10
done
/usr/bin/chromium --version 2>/dev/null  # its wrapper script prints a harmless shell warning
