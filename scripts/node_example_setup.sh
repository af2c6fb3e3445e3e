#!/usr/bin/env bash
# Installs the Node.js example's dependencies (examples/node/package.json) into
# .cache/node-example, not into git, and prints the node_modules directory. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

DIR=.cache/node-example
STAMP="$DIR/.installed-$(md5sum examples/node/package.json | cut -c1-12)"
if [ ! -f "$STAMP" ]; then
  mkdir -p "$DIR"
  cp examples/node/package.json "$DIR/package.json"
  (cd "$DIR" && npm install --no-audit --no-fund --silent >&2)
  touch "$STAMP"
fi
echo "$(pwd)/$DIR/node_modules"
