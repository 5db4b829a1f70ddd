// Build the language server's wheel into bundled/ for the .vsix (run by `vscode:prepublish`): the
// extension offers to install it into the user's interpreter, as the Python tool extensions carry
// their tools. The Python that builds it: $SHARDPROOF_PYTHON, else the repository's .venv, else python3.
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, rmSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const venv = join(root, '.venv', 'bin', 'python');
const python = process.env.SHARDPROOF_PYTHON || (existsSync(venv) ? venv : 'python3');
const bundled = join(root, 'bundled');
rmSync(bundled, { recursive: true, force: true });
mkdirSync(bundled);
execFileSync(python, ['-m', 'pip', 'wheel', '--no-deps', '--quiet', '--wheel-dir', bundled, root], {
  stdio: 'inherit',
});
const wheels = readdirSync(bundled).filter((name) => /^shardproof-.*\.whl$/.test(name));
if (wheels.length !== 1) {
  throw new Error(`expected one shardproof wheel in ${bundled}, found ${wheels.join(', ') || 'none'}`);
}
console.log(`bundled ${wheels[0]}`);
