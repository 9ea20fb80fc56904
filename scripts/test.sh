#!/usr/bin/env bash
# Set up .venv (scripts/setup.sh), then lint, type-check and run the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/install_browser.sh  # chromium + chromedriver for the playground's browser tests
.venv/bin/ruff check radixlm tests
.venv/bin/mypy
.venv/bin/mypy --strict radixlm/messages radixlm/mem_cache radixlm/scheduler radixlm/sampling radixlm/speculative
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
