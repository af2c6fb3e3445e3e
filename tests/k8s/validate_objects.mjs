// Validates Kubernetes objects (a JSON array, file named by the last argument) against the
// schemas of the npm packages kubernetes-models (core, apps, policy, autoscaling, networking) and
// @kubernetes-models/prometheus-operator (monitoring.coreos.com). Prints one JSON line per object:
// {"kind", "name", "error"} (error null when valid). Exits 1 on an object of an unknown kind.
// Run from the directory holding their node_modules (scripts/k8s_tools_setup.sh prints it):
//   node --input-type=module - objects.json < validate_objects.mjs
import fs from 'fs';

const docs = JSON.parse(fs.readFileSync(process.argv[process.argv.length - 1], 'utf8'));
let unknown = 0;
for (const doc of docs) {
  const [group, version] = doc.apiVersion.includes('/') ? doc.apiVersion.split('/') : ['', doc.apiVersion];
  const module = group === 'monitoring.coreos.com'
      ? `@kubernetes-models/prometheus-operator/${group}/${version}`
      : group ? `kubernetes-models/${group}/${version}` : `kubernetes-models/${version}`;
  const Model = (await import(module))[doc.kind];
  if (!Model) {
    console.log(JSON.stringify({kind: doc.kind, name: doc.metadata?.name, error: `no schema for ${doc.apiVersion} ${doc.kind}`}));
    unknown++;
    continue;
  }
  let error = null;
  try {
    new Model(doc).validate();
  } catch (e) {
    error = e.message;
  }
  console.log(JSON.stringify({kind: doc.kind, name: doc.metadata?.name, error}));
}
process.exit(unknown ? 1 : 0);
