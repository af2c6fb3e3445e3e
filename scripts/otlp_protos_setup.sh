#!/usr/bin/env bash
# Installs OpenTelemetry's OTLP protocol buffers (opentelemetry-proto, as the npm package
# @opentelemetry/otlp-grpc-exporter-base 0.34.0 ships them under build/protos) into
# .cache/otlp-protos, not into git, and prints that directory. tests/e2e/test_tracing.py compiles
# them with protoc to decode what pdserve exports: a decoder independent of pdserve's encoder.
# Idempotent. Needs npm and python3 (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

DIR=.cache/otlp-protos
PACKAGE=@opentelemetry/otlp-grpc-exporter-base@0.34.0
STAMP="$DIR/.installed-$(echo "$PACKAGE" | md5sum | cut -c1-12)"
if [ ! -f "$STAMP" ]; then
  rm -rf "$DIR"
  mkdir -p "$DIR/pack"
  (cd "$DIR/pack" && npm pack --silent "$PACKAGE" >/dev/null)
  python3 - "$DIR" <<'PY'
import glob, os, sys, tarfile
d = sys.argv[1]
tgz, = glob.glob(os.path.join(d, "pack", "*.tgz"))
prefix = "package/build/protos/"
with tarfile.open(tgz) as t:
    for m in t.getmembers():
        if m.isfile() and m.name.startswith(prefix + "opentelemetry/proto/") and m.name.endswith(".proto"):
            out = os.path.join(d, m.name[len(prefix):])
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with open(out, "wb") as f:
                f.write(t.extractfile(m).read())
PY
  rm -rf "$DIR/pack"
  test -f "$DIR/opentelemetry/proto/collector/trace/v1/trace_service.proto"
  touch "$STAMP"
fi
echo "$PWD/$DIR"
