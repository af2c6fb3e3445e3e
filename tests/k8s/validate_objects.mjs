// Validates Kubernetes objects (a JSON array, file named by the last argument) against the
// schemas of the npm packages kubernetes-models (core, apps, policy, autoscaling, networking),
// @kubernetes-models/prometheus-operator (monitoring.coreos.com) and @kubernetes-models/keda
// (keda.sh). Prints one JSON line per object:
// {"kind", "name", "error"} (error null when valid): a schema violation, or a field name the
// object's type does not have. Exits 1 on an object of an unknown kind.
// Run from the directory holding their node_modules (scripts/k8s_tools_setup.sh prints it):
//   node --input-type=module - objects.json < validate_objects.mjs
import fs from 'fs';
import path from 'path';

// The field names each object type may have, read from the packages' TypeScript declarations
// (their JSON-schema validators accept any extra field, so a misspelt one would pass): an
// interface's `"name"?: Type;` lines. A field's entry is the declaration file of its Type when
// that is an interface of another file (checked in turn, alone or in an Array<>), a nested Map
// when Type is an inline object literal (`{` or `Array<{` ending the line, as the CRD packages
// write every nested type), ANY for a literal with an index signature (`[key: string]: ...`, a
// map of free keys), or null for anything else (a primitive, a union: not descended into).
const ANY = 'any';
const declarations = new Map();
function declaration(file) {
  if (declarations.has(file)) return declarations.get(file);
  declarations.set(file, null);
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
  const fields = new Map();
  const stack = [fields];  // The literal each line belongs to; [0] is the interface itself.
  const parents = [];      // [map, key] of each open literal, to mark it ANY.
  for (const line of body[1].split('\n')) {
    const field = line.match(/^\s*"([^"]+)"\??: (.*?);?$/);
    if (field) {
      const type = field[2];
      if (/(^|<)\{$/.test(type)) {
        const nested = new Map();
        stack[stack.length - 1].set(field[1], nested);
        parents.push([stack[stack.length - 1], field[1]]);
        stack.push(nested);
        continue;
      }
      const ref = type.match(/^(?:Array<)?(\w+)>?$/);
      let target = null;
      if (ref && imports.has(ref[1])) {
        const spec = imports.get(ref[1]);
        target = spec.startsWith('.') ? path.resolve(path.dirname(file), spec + '.d.ts')
                                      : path.resolve('node_modules', spec + '.d.ts');
      }
      stack[stack.length - 1].set(field[1], target);
    } else if (/^\s*\[key: string\]/.test(line)) {
      if (parents.length) {
        const [map, key] = parents[parents.length - 1];
        map.set(key, ANY);
      }
      if (/\{$/.test(line)) {  // A map of literals: its values are not descended into.
        parents.push([new Map(), '']);
        stack.push(new Map());
      }
    } else if (/^\s*\}[>\]]*\)?;?$/.test(line) && stack.length > 1) {
      stack.pop();
      parents.pop();
    }
  }
  declarations.set(file, fields);
  return fields;
}

// Adds to `out` each field of `value` that `fields` (a declaration file's name, or a Map of an
// inline literal) does not have.
function unknownFields(value, fields, where, out) {
  if (Array.isArray(value)) {
    value.forEach((v, i) => unknownFields(v, fields, `${where}[${i}]`, out));
    return;
  }
  if (typeof fields === 'string' && fields !== ANY) fields = declaration(fields);
  if (!(fields instanceof Map) || value === null || typeof value !== 'object') return;
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
      : group === 'keda.sh' ? `@kubernetes-models/keda/${group}/${version}`
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
