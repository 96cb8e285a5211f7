#!/usr/bin/env node
/**
 * Writes src/wire.ts, the report's and the verdict's TypeScript types, from their JSON Schema
 * (jupyter_gpu_gov/events/wire.v1.schema.json, itself generated from core/wire.py).
 * tests/test_wire.py fails when src/wire.ts is not what this prints.
 *
 * Every property is optional (`?`) and every enumeration open (`| string`): the frontend may talk
 * to a server or governor of another version, and reads each field as possibly absent or new.
 * An open object names its type in `tsType` (types.ts).
 *
 * Usage: node scripts/wire-types.js [--print]
 */
const fs = require('fs');
const path = require('path');

const here = path.resolve(__dirname, '..');
const schemaFile = path.resolve(
  here,
  '..',
  'jupyter_gpu_gov',
  'events',
  'wire.v1.schema.json'
);
const out = path.resolve(here, 'src', 'wire.ts');

// Enumerations with a name of their own (tsName): name -> values.
const named = new Map();

function typeOf(prop, imports) {
  if (prop.tsType) {
    imports.add(prop.tsType);
    const nullable = [].concat(prop.type || []).includes('null');
    return nullable ? `${prop.tsType} | null` : prop.tsType;
  }
  if (prop.$ref) {
    return `I${prop.$ref.split('/').pop()}`;
  }
  if (prop.anyOf) {
    return prop.anyOf.map(p => typeOf(p, imports)).join(' | ');
  }
  if (prop.const !== undefined) {
    return JSON.stringify(prop.const);
  }
  if (prop.enum && prop.tsName) {
    named.set(prop.tsName, prop.enum);
    return `${prop.tsName} | string`;
  }
  if (prop.enum) {
    const values = prop.enum.map(v => (v === null ? 'null' : `'${v}'`));
    return [...values, 'string'].join(' | ');
  }
  const names = {
    string: 'string',
    integer: 'number',
    number: 'number',
    boolean: 'boolean',
    object: 'Record<string, unknown>',
    null: 'null'
  };
  return []
    .concat(prop.type)
    .map(t => {
      if (t === 'array') {
        const item = typeOf(prop.items, imports);
        return item.includes(' ') ? `(${item})[]` : `${item}[]`;
      }
      return names[t];
    })
    .join(' | ');
}

function comment(text, indent) {
  const words = text.split(/\s+/);
  const lines = [];
  let line = '';
  for (const word of words) {
    if (line && indent.length + 3 + line.length + 1 + word.length > 96) {
      lines.push(line);
      line = word;
    } else {
      line = line ? `${line} ${word}` : word;
    }
  }
  lines.push(line);
  if (lines.length === 1) {
    return `${indent}/** ${lines[0].replace(/\*\//g, '*\\/')} */`;
  }
  return [
    `${indent}/**`,
    ...lines.map(l => `${indent} * ${l.replace(/\*\//g, '*\\/')}`),
    `${indent} */`
  ].join('\n');
}

function generate(schema) {
  const imports = new Set();
  const blocks = [];
  for (const [name, def] of Object.entries(schema.$defs)) {
    const props = Object.entries(def.properties).map(
      ([key, prop]) =>
        `${comment(prop.description, '  ')}\n  ${key}?: ${typeOf(prop, imports)};`
    );
    blocks.push(
      `${comment(def.description, '')}\nexport interface I${name} {\n${props.join('\n')}\n}`
    );
  }
  const head = [
    '/**',
    ` * Generated from ${schema.$id} (jupyter_gpu_gov/events/wire.v1.schema.json) by`,
    ' * scripts/wire-types.js: do not edit. The report and the verdict, as docs/api.md lists them.',
    ' */',
    ''
  ];
  if (imports.size) {
    head.push(
      `import type { ${[...imports].sort().join(', ')} } from './types';`,
      ''
    );
  }
  for (const [name, values] of named) {
    const literals = values.map(v => `'${v}'`).join(' | ');
    blocks.unshift(
      `/** One of the values the schema lists. */\nexport type ${name} = ${literals};`
    );
  }
  return `${head.join('\n')}${blocks.join('\n\n')}\n`;
}

async function main() {
  // In the project's own style, so that `npm run lint:check` passes on what is generated.
  const prettier = require('prettier');
  const options = (await prettier.resolveConfig(out)) || {};
  const text = await prettier.format(
    generate(JSON.parse(fs.readFileSync(schemaFile, 'utf8'))),
    { ...options, filepath: out }
  );
  if (process.argv.includes('--print')) {
    process.stdout.write(text);
  } else {
    fs.writeFileSync(out, text);
  }
}

main().catch(error => {
  console.error(error);
  process.exit(1);
});
