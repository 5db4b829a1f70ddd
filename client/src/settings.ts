import * as vscode from 'vscode';
import { SETTINGS_SECTION } from './constants';

export type EditorConfiguration = 'full' | 'quick';

export interface ServerSettings {
  run: 'onType' | 'onSave';
  /** What the editor verifies on edits: each check's full declaration, or its quick table. */
  editorConfiguration: EditorConfiguration;
  debounceMs: number;
  workerTimeoutSeconds: number;
  logLevel: string;
}

export function readServerSettings(folder?: vscode.WorkspaceFolder): ServerSettings {
  const config = vscode.workspace.getConfiguration(SETTINGS_SECTION, folder);
  return {
    run: config.get<'onType' | 'onSave'>('run', 'onType'),
    editorConfiguration: config.get<EditorConfiguration>('editorConfiguration', 'full'),
    debounceMs: config.get<number>('debounceMs', 600),
    workerTimeoutSeconds: config.get<number>('workerTimeoutSeconds', 300),
    logLevel: config.get<string>('logLevel', 'info'),
  };
}

export function interpreterSetting(folder?: vscode.WorkspaceFolder): string[] {
  const value = vscode.workspace.getConfiguration(SETTINGS_SECTION, folder).get<string[]>('interpreter', []);
  return Array.isArray(value) ? value.filter((part) => typeof part === 'string' && part.length > 0) : [];
}

/** Settings whose change needs a new server process; the others are sent to the running server. */
export function needsRestart(event: vscode.ConfigurationChangeEvent): boolean {
  return event.affectsConfiguration(`${SETTINGS_SECTION}.interpreter`);
}

export function affectsServer(event: vscode.ConfigurationChangeEvent): boolean {
  return ['run', 'editorConfiguration', 'debounceMs', 'workerTimeoutSeconds', 'logLevel'].some((key) =>
    event.affectsConfiguration(`${SETTINGS_SECTION}.${key}`),
  );
}
