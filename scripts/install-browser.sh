#!/usr/bin/env bash
# Headless Chromium for tests/integration/plugins/test_browser.py, from Debian's own package
# (Playwright drives it with executable_path; it never downloads a browser).
# Does nothing when /usr/bin/chromium is already there; sudo only when not root.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq chromium
test -x /usr/bin/chromium
/usr/bin/chromium --version
