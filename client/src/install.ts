import * as fs from 'fs';
import * as path from 'path';
import * as vscode from 'vscode';
import { Interpreter } from './python';

/**
 * Installing the language server into the user's interpreter. shardproof is not published on a
 * package index: the extension carries its server as a wheel (bundled/ in the .vsix, built by
 * `vscode:prepublish`), the way the Python tool extensions carry their tools, and offers to install
 * it into the selected interpreter. The wheel depends on torch 2.13: on a machine that reaches only
 * the public index, pip takes torch's CUDA build (several GB); PyTorch's CPU wheel index avoids it.
 */

export const CPU_TORCH_INDEX = 'https://download.pytorch.org/whl/cpu';

/** The server's wheel inside the installed extension, if this build carries one. */
export function bundledWheel(extensionPath: string): string | undefined {
  const directory = path.join(extensionPath, 'bundled');
  try {
    const wheel = fs.readdirSync(directory).find((name) => /^shardproof-.*\.whl$/.test(name));
    return wheel ? path.join(directory, wheel) : undefined;
  } catch {
    return undefined;
  }
}

function quoted(part: string): string {
  return /[\s"']/.test(part) ? `"${part.replace(/"/g, '\\"')}"` : part;
}

/** `<interpreter> -m pip install <the bundled wheel>`, or the source checkout when there is none. */
export function installCommand(interpreter: Interpreter, wheel: string | undefined): string {
  const python = [interpreter.command, ...interpreter.args].map(quoted).join(' ');
  const target = wheel ? quoted(wheel) : '-e <a clone of the shardproof repository> -c constraints.txt';
  return `${python} -m pip install ${target}`;
}

/** Run the install command in a terminal the user sees (pip may ask, and takes a while for torch). */
export function runInstall(command: string): void {
  const terminal = vscode.window.createTerminal({ name: 'shardproof: install' });
  terminal.show();
  terminal.sendText(command, true);
  void vscode.window.showInformationMessage(
    'shardproof: when the install has finished, run "shardproof: Restart Server".',
  );
}
