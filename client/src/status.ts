import * as vscode from 'vscode';
import { Commands } from './constants';

export type StatusState =
  | { kind: 'off' }
  | { kind: 'starting' }
  | { kind: 'idle' }
  | { kind: 'verifying'; check: string; detail?: string; percentage?: number }
  | { kind: 'discrepancies'; count: number }
  | { kind: 'error'; message: string };

/** The status bar item: idle, verifying (with progress), discrepancies found, or an error. */
export class StatusItem implements vscode.Disposable {
  private readonly item: vscode.StatusBarItem;
  private state: StatusState = { kind: 'off' };

  constructor() {
    this.item = vscode.window.createStatusBarItem('shardproof.status', vscode.StatusBarAlignment.Left, 100);
    this.item.name = 'shardproof';
    this.item.command = Commands.showLogs;
  }

  get current(): StatusState {
    return this.state;
  }

  set(state: StatusState): void {
    this.state = state;
    const item = this.item;
    item.backgroundColor = undefined;
    switch (state.kind) {
      case 'off':
        item.hide();
        return;
      case 'starting':
        item.text = '$(loading~spin) shardproof: starting';
        item.tooltip = 'Starting the shardproof server';
        break;
      case 'idle':
        item.text = '$(pass) shardproof';
        item.tooltip = 'shardproof: every check verified. Click for the logs.';
        break;
      case 'verifying': {
        const progress = state.percentage !== undefined ? ` ${state.percentage}%` : '';
        item.text = `$(sync~spin) shardproof: verifying ${state.check}${progress}`;
        item.tooltip = state.detail ? `shardproof: ${state.detail}` : `shardproof: verifying ${state.check}`;
        break;
      }
      case 'discrepancies':
        item.text = `$(error) shardproof: ${state.count} ${state.count === 1 ? 'discrepancy' : 'discrepancies'}`;
        item.tooltip = 'shardproof found discrepancies (see the Problems panel). Click for the logs.';
        item.backgroundColor = new vscode.ThemeColor('statusBarItem.errorBackground');
        break;
      case 'error':
        item.text = '$(warning) shardproof: error';
        item.tooltip = `shardproof: ${state.message}. Click for the logs.`;
        item.backgroundColor = new vscode.ThemeColor('statusBarItem.warningBackground');
        break;
    }
    item.show();
  }

  dispose(): void {
    this.item.dispose();
  }
}
