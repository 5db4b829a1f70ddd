import * as vscode from 'vscode';
import { execFile } from 'child_process';
import { interpreterSetting } from './settings';
import { traceInfo, traceWarn } from './logging';

export interface Interpreter {
  command: string;
  args: string[];
  source: 'setting' | 'python-extension' | 'path';
}

const PYTHON_EXTENSION = 'ms-python.python';

/**
 * The interpreter that runs the server: the `shardproof.interpreter` setting, else the Python
 * extension's active interpreter (when that extension is installed), else `python3` on PATH.
 */
export async function resolveInterpreter(folder?: vscode.WorkspaceFolder): Promise<Interpreter> {
  const fromSetting = interpreterSetting(folder);
  if (fromSetting.length > 0) {
    return { command: fromSetting[0], args: fromSetting.slice(1), source: 'setting' };
  }
  const fromExtension = await pythonExtensionInterpreter(folder);
  if (fromExtension) {
    return { command: fromExtension, args: [], source: 'python-extension' };
  }
  return { command: 'python3', args: [], source: 'path' };
}

async function pythonExtensionInterpreter(folder?: vscode.WorkspaceFolder): Promise<string | undefined> {
  if (!vscode.extensions.getExtension(PYTHON_EXTENSION)) {
    return undefined;
  }
  try {
    const { PythonExtension } = await import('@vscode/python-extension');
    const api = await PythonExtension.api();
    const path = api.environments.getActiveEnvironmentPath(folder?.uri);
    const resolved = await api.environments.resolveEnvironment(path);
    return resolved?.executable.uri?.fsPath ?? path.path;
  } catch (error) {
    traceWarn(`could not ask the Python extension for its interpreter: ${String(error)}`);
    return undefined;
  }
}

/** Subscribe to interpreter changes in the Python extension (restart when the user switches). */
export async function onPythonInterpreterChanged(listener: () => void): Promise<vscode.Disposable | undefined> {
  if (!vscode.extensions.getExtension(PYTHON_EXTENSION)) {
    return undefined;
  }
  try {
    const { PythonExtension } = await import('@vscode/python-extension');
    const api = await PythonExtension.api();
    return api.environments.onDidChangeActiveEnvironmentPath(() => listener());
  } catch {
    return undefined;
  }
}

export interface ImportCheck {
  ok: boolean;
  version?: string;
  detail: string;
}

/** Can this interpreter import shardproof? (Without importing torch: fast.) */
export function checkShardproof(interpreter: Interpreter): Promise<ImportCheck> {
  const script = 'import sys, shardproof; print(shardproof.__version__, sys.version.split()[0])';
  return new Promise((resolve) => {
    execFile(interpreter.command, [...interpreter.args, '-c', script], { timeout: 60000 }, (error, stdout, stderr) => {
      if (error) {
        resolve({ ok: false, detail: (stderr || error.message).trim() });
        return;
      }
      const [version, python] = stdout.trim().split(/\s+/);
      traceInfo(`shardproof ${version} on Python ${python} (${interpreter.command})`);
      resolve({ ok: true, version, detail: stdout.trim() });
    });
  });
}
