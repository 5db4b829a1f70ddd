import * as vscode from 'vscode';
import { Commands } from './constants';

export type StatusState =
  | { kind: 'off' }
  | { kind: 'starting' }
  | { kind: 'idle'; quick: string[] }
  | {
      kind: 'verifying';
      check: string;
      /** "full" (the declaration) or "quick" (the check's quick table). */
      mode?: string;
      worldSize?: number;
      /** What the run is doing: "capture", "capturing rank 3 of 8", "verification", ... */
      stage?: string;
      /** Where a long run is in the user's code ("still running after 20 s at tp.py:78 in forward"). */
      where?: string;
      percentage?: number;
    }
  | { kind: 'findings'; discrepancies: number; unproven: number; quick: string[] }
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
        item.text = `$(pass) shardproof${quickMark(state.quick)}`;
        item.tooltip = `shardproof: every check verified${configurationNote(state.quick)}. Click for the logs.`;
        break;
      case 'verifying': {
        item.text = `$(sync~spin) shardproof: ${verifyingText(state)}`;
        const configuration = state.mode === 'quick' ? 'its quick configuration' : 'its full declaration';
        const lines = [`shardproof: verifying ${state.check} (${configuration})`];
        if (state.worldSize || state.stage) {
          lines.push([state.worldSize ? `world size ${state.worldSize}` : '', state.stage ?? ''].filter(Boolean).join(': '));
        }
        if (state.percentage !== undefined) {
          lines.push(`${state.percentage}% of this check done`);
        }
        if (state.where) {
          lines.push(state.where);
        }
        item.tooltip = lines.join('\n');
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
        item.text = `shardproof: ${parts.join(' · ')}${quickMark(state.quick)}`;
        item.tooltip =
          (state.discrepancies > 0 ? 'shardproof found discrepancies the numbers confirm. ' : '') +
          (state.unproven > 0 ? 'Some values are not proven (the numbers show no difference). ' : '') +
          `Results${configurationNote(state.quick)}. See the Problems panel; click for the logs.`;
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

/** The longest stage shown in the status bar itself; the tooltip has it all. */
const STAGE_CHARS = 40;

/** "llama-tp (quick), world size 8: capturing rank 3 of 8 · 40%" */
export function verifyingText(state: {
  check: string;
  mode?: string;
  worldSize?: number;
  stage?: string;
  percentage?: number;
}): string {
  let text = state.check + (state.mode === 'quick' ? ' (quick)' : '');
  if (state.worldSize) {
    text += `, world size ${state.worldSize}`;
  }
  const stage = state.stage ?? 'starting';
  text += `: ${stage.length > STAGE_CHARS ? `${stage.slice(0, STAGE_CHARS - 1)}…` : stage}`;
  if (state.percentage !== undefined) {
    text += ` · ${state.percentage}%`;
  }
  return text;
}

/** " (quick)" when a shown result is from a quick configuration, so the user knows it is not the full model. */
function quickMark(quick: string[]): string {
  return quick.length > 0 ? ' (quick)' : '';
}

function configurationNote(quick: string[]): string {
  return quick.length > 0
    ? ` (quick configuration: ${quick.join(', ')}; the others in full)`
    : ' (full declarations)';
}
