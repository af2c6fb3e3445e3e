// Validates Kubernetes objects (a JSON array, file named by the last argument) against the
// schemas of the npm packages kubernetes-models (core, apps, policy, autoscaling, networking) and
// @kubernetes-models/prometheus-operator (monitoring.coreos.com). Prints one JSON line per object:
// {"kind", "name", "error"} (error null when valid): a schema violation, or a field name the
// object's type does not have. Exits 1 on an object of an unknown kind.
// Run from the directory holding their node_modules (scripts/k8s_tools_setup.sh prints it):
//   node --input-type=module - objects.json < validate_objects.mjs
import fs from 'fs';
import path from 'path';

// The field names each object type may have, read from the packages' TypeScript declarations
// (their JSON-schema validators accept any extra field, so a misspelt one would pass): an
// interface's `"name"?: Type;` lines, with Type an interface of another declaration file (checked
// in turn, alone or in an Array<>), or anything else (a primitive, a map, an inline literal: not
// descended into).
const declarations = new Map();
function declaration(file) {
  if (declarations.has(file)) return declarations.get(file);
  const fields = new Map();
  declarations.set(file, fields);
  let text;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch {
    return null;  // No declaration: not checked.
  }
  const imports = new Map();
  for (const m of text.matchAll(/^import \{ (\w+) \} from "([^"]+)";$/gm)) imports.set(m[1], m[2]);
  const body = text.match(/^export interface \w+(?: extends [\w, ]+)? \{\n([\s\S]*?)^\}/m);
  if (!body) return null;  // A type alias (IntOrString, Quantity, ...): a leaf.
  for (const m of body[1].matchAll(/^    "([^"]+)"\??: (.*?);?$/gm)) {
    const ref = m[2].match(/^(?:Array<)?(\w+)>?$/);
    let target = null;
    if (ref && imports.has(ref[1])) {
      const spec = imports.get(ref[1]);
      target = spec.startsWith('.') ? path.resolve(path.dirname(file), spec + '.d.ts')
                                    : path.resolve('node_modules', spec + '.d.ts');
    }
    fields.set(m[1], target);
  }
  return fields;
}

function unknownFields(value, file, where, out) {
  if (Array.isArray(value)) {
    value.forEach((v, i) => unknownFields(v, file, `${where}[${i}]`, out));
    return;
  }
  const fields = declaration(file);
  if (!fields || value === null || typeof value !== 'object') return;
  for (const [key, v] of Object.entries(value)) {
    if (!fields.has(key)) {
      out.push(`unknown field ${where ? where + '.' : ''}${key}`);
    } else if (fields.get(key)) {
      unknownFields(v, fields.get(key), where ? `${where}.${key}` : key, out);
    }
  }
}

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
  const unknown = [];
  unknownFields(doc, path.resolve('node_modules', module + '/' + doc.kind + '.d.ts'), '', unknown);
  if (!error && unknown.length) error = unknown.join('; ');
  console.log(JSON.stringify({kind: doc.kind, name: doc.metadata?.name, error}));
}
process.exit(unknown ? 1 : 0);
