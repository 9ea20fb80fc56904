#!/usr/bin/env bash
# Install Debian's headless browser for the playground's browser tests
# (tests/entrypoints/test_playground_browser.py): chromium + chromium-driver. Idempotent.
# Without apt-get it only says so (those tests then skip); a failed install leaves the
# browser missing, and the tests fail rather than skip.
set -uo pipefail
if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "install_browser: apt-get is unavailable; the browser tests will be skipped"
  exit 0
fi
SUDO=()
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    SUDO=(sudo -n)
  else
    echo "install_browser: need root (or sudo) to apt-get install chromium chromium-driver"
    exit 0
  fi
fi
echo "install_browser: apt-get install chromium chromium-driver"
export DEBIAN_FRONTEND=noninteractive
{ "${SUDO[@]}" apt-get update -qq && "${SUDO[@]}" apt-get install -y -qq \
    chromium chromium-driver; } >/tmp/radixlm-install-browser.log 2>&1 \
  || { echo "install_browser: apt-get failed (log: /tmp/radixlm-install-browser.log)"; tail -5 /tmp/radixlm-install-browser.log; }
exit 0
