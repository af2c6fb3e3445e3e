#!/usr/bin/env bash
# Fetches llama.cpp's gguf-py (the GGUF reader/writer in pure Python over numpy, with its own
# dequantizers for every block type) from the npm package node-llama-cpp, which ships llama.cpp's
# source as a git bundle, into .cache/llama.cpp (not into git), and prints gguf-py's directory.
# The GGUF tests read pdserve's files back with it: an independent decoder. Idempotent; needs
# npm and git (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=3.22.1
DIR=.cache/llama.cpp
STAMP="$DIR/.fetched-$VERSION"
if [ ! -f "$STAMP" ]; then
  rm -rf "$DIR" .cache/node-llama-cpp
  mkdir -p .cache/node-llama-cpp
  (cd .cache/node-llama-cpp && npm pack --silent "node-llama-cpp@$VERSION" >/dev/null &&
     tar -xzf "node-llama-cpp-$VERSION.tgz" package/llama/gitRelease.bundle)
  git -c advice.detachedHead=false clone --quiet .cache/node-llama-cpp/package/llama/gitRelease.bundle "$DIR"
  rm -rf .cache/node-llama-cpp
  touch "$STAMP"
fi
echo "$(pwd)/$DIR/gguf-py"
