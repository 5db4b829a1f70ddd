import * as vscode from 'vscode';
import { registerCommands } from './commands';
import { SETTINGS_SECTION } from './constants';
import { createLogChannel, traceInfo } from './logging';
import { onPythonInterpreterChanged } from './python';
import { ServerManager } from './server';
import { affectsServer, needsRestart } from './settings';
import { StatusItem } from './status';

let server: ServerManager | undefined;

/** The first workspace folder whose pyproject.toml declares [tool.shardproof]. */
async function declaringFolder(): Promise<vscode.WorkspaceFolder | undefined> {
  for (const folder of vscode.workspace.workspaceFolders ?? []) {
    const files = await vscode.workspace.findFiles(
      new vscode.RelativePattern(folder, '{pyproject.toml,*/pyproject.toml}'),
      '**/{node_modules,.venv,.git}/**',
      20,
    );
    for (const file of files) {
      const text = new TextDecoder().decode(await vscode.workspace.fs.readFile(file));
      if (/^\s*\[+\s*tool\.shardproof/m.test(text)) {
        return folder;
      }
    }
  }
  return undefined;
}

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  const log = createLogChannel();
  const status = new StatusItem();
  let folder: vscode.WorkspaceFolder | undefined;
  server = new ServerManager(status, () => folder, context.extensionPath);
  context.subscriptions.push(log, status, server);
  registerCommands(context, server);

  const startIfDeclared = async (reason: string) => {
    if (!vscode.workspace.isTrusted) {
      traceInfo('the workspace is not trusted: shardproof runs model code, so it waits for trust');
      return;
    }
    const declared = await declaringFolder();
    if (!declared) {
      traceInfo('no [tool.shardproof] declaration in the workspace; the server is not started');
      return;
    }
    if (!server?.client || declared !== folder) {
      folder = declared;
      await server?.restart(reason);
    }
  };

  const watcher = vscode.workspace.createFileSystemWatcher('**/pyproject.toml');
  context.subscriptions.push(
    watcher,
    watcher.onDidCreate(() => startIfDeclared('a pyproject.toml was created')),
    watcher.onDidChange(() => (server?.client ? undefined : startIfDeclared('pyproject.toml changed'))),
    vscode.workspace.onDidGrantWorkspaceTrust(() => startIfDeclared('the workspace is now trusted')),
    vscode.workspace.onDidChangeWorkspaceFolders(() => startIfDeclared('workspace folders changed')),
    vscode.workspace.onDidChangeConfiguration(async (event) => {
      if (!event.affectsConfiguration(SETTINGS_SECTION)) {
        return;
      }
      if (needsRestart(event)) {
        await server?.restart('the interpreter setting changed');
      } else if (affectsServer(event)) {
        await server?.sendSettings();
      }
    }),
  );
  const pythonWatcher = await onPythonInterpreterChanged(() => {
    void server?.restart('the Python extension switched interpreters');
  });
  if (pythonWatcher) {
    context.subscriptions.push(pythonWatcher);
  }
  await startIfDeclared('activation');
}

export async function deactivate(): Promise<void> {
  await server?.stop();
}
