import * as vscode from 'vscode';

// One log output channel for the client and the server (languageclient 11 needs a LogOutputChannel).
let channel: vscode.LogOutputChannel | undefined;

export function createLogChannel(): vscode.LogOutputChannel {
  channel = vscode.window.createOutputChannel('shardproof', { log: true });
  return channel;
}

export function logChannel(): vscode.LogOutputChannel | undefined {
  return channel;
}

export function traceInfo(message: string): void {
  channel?.info(message);
}

export function traceWarn(message: string): void {
  channel?.warn(message);
}

export function traceError(message: string): void {
  channel?.error(message);
}
