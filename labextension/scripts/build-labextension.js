#!/usr/bin/env node
/**
 * Offline `jupyter labextension build`: passes --core-path (the installed jupyterlab/staging)
 * so nothing tries to download @jupyterlab/core-meta, and puts the Python's bin folder on PATH
 * (JupyterLab >= 4.6 delegates to `jupyter-builder`, found through PATH).
 *
 * Python: $PYTHON, else ../.venv/bin/python when it exists, else python3.
 * Usage: node scripts/build-labextension.js [--development True] [--source-map True]
 */
const { execFileSync, spawnSync } = require('child_process');
const fs = require('fs');
const path = require('path');

const here = path.resolve(__dirname, '..');
const venvPython = path.resolve(here, '..', '.venv', 'bin', 'python');
const python =
  process.env.PYTHON || (fs.existsSync(venvPython) ? venvPython : 'python3');

const staging = execFileSync(
  python,
  [
    '-c',
    'import jupyterlab, os; print(os.path.join(os.path.dirname(jupyterlab.__file__), "staging"))'
  ],
  { encoding: 'utf8' }
).trim();

const binDir = path.dirname(
  execFileSync(python, ['-c', 'import sys; print(sys.executable)'], {
    encoding: 'utf8'
  }).trim()
);

const args = [
  '-m',
  'jupyterlab.labextensions',
  'build',
  ...process.argv.slice(2),
  '--core-path',
  staging,
  here
];
console.log(`${python} ${args.join(' ')}`);
const result = spawnSync(python, args, {
  stdio: 'inherit',
  env: { ...process.env, PATH: `${binDir}${path.delimiter}${process.env.PATH}` }
});
if (result.status === 0) {
  // install.json (how the extension was installed) goes with the build output, so the wheel's
  // one shared-data folder carries it.
  const outputDir = path.resolve(
    here,
    require('../package.json').jupyterlab.outputDir
  );
  fs.copyFileSync(
    path.join(here, 'install.json'),
    path.join(outputDir, 'install.json')
  );
}
process.exit(result.status === null ? 1 : result.status);
