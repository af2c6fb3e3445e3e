#!/usr/bin/env bash
# Installs the official OpenAI Node.js client (pinned; the 5.x line runs on Node 20, later lines
# need Node 22) into .cache/openai-client, not into git, and prints that directory. Idempotent.
# Needs node and npm (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

DIR=.cache/openai-client
PACKAGES=(openai@5.23.2)
STAMP="$DIR/.installed-$(echo "${PACKAGES[*]}" | md5sum | cut -c1-12)"
if [ ! -f "$STAMP" ]; then
  mkdir -p "$DIR"
  (cd "$DIR" && [ -f package.json ] || echo '{"name": "pdserve-openai-client", "private": true, "type": "module"}' > package.json)
  (cd "$DIR" && npm install --no-audit --no-fund --silent "${PACKAGES[@]}" >&2)
  touch "$STAMP"
fi
echo "$(pwd)/$DIR"
