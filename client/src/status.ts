import * as vscode from 'vscode';
import { Commands } from './constants';

export type StatusState =
  | { kind: 'off' }
  | { kind: 'starting' }
  | { kind: 'idle' }
  | { kind: 'verifying'; check: string; detail?: string; percentage?: number }
  | { kind: 'findings'; discrepancies: number; unproven: number }
  | { kind: 'error'; message: string };

/** The status bar item: idle, verifying (with progress), discrepancies and unproven findings, or an error. */
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
      case 'findings': {
        const parts: string[] = [];
        if (state.discrepancies > 0) {
          parts.push(`$(error) ${state.discrepancies} ${state.discrepancies === 1 ? 'discrepancy' : 'discrepancies'}`);
        }
        if (state.unproven > 0) {
          parts.push(`$(warning) ${state.unproven} unproven`);
        }
        item.text = `shardproof: ${parts.join(' · ')}`;
        item.tooltip =
          (state.discrepancies > 0 ? 'shardproof found discrepancies the numbers confirm. ' : '') +
          (state.unproven > 0 ? 'Some values are not proven (the numbers show no difference). ' : '') +
          'See the Problems panel; click for the logs.';
        item.backgroundColor = new vscode.ThemeColor(
          state.discrepancies > 0 ? 'statusBarItem.errorBackground' : 'statusBarItem.warningBackground',
        );
        break;
      }
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
