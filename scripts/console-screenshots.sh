#!/usr/bin/env bash
# Refreshes docs/console/*.png (the README's screenshots of the operator console) by running the console's browser
# test, which drives Debian's chromium against a live server with the real model and takes them on the way.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD"
LETHE_CONSOLE_SCREENSHOTS=docs/console .venv/bin/pytest -q tests/console/test_console.py -k "forget_a_message or hundreds"
