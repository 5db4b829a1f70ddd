import * as vscode from 'vscode';
import { ExecuteCommandRequest, State, WorkDoneProgress, WorkDoneProgressCancelNotification } from 'vscode-languageclient/node';
import { Commands, DIAGNOSTIC_SOURCE, ServerCommands } from './constants';
import { Explanation, OPEN_LOCATION_COMMAND, openLocation, showExplanation } from './explain';
import { logChannel } from './logging';
import { ServerManager } from './server';

interface FullModelSummary {
  cancelled: boolean;
  verified: number;
  discrepancy: number;
  unproven?: number;
  interrupted?: number;
  inconclusive: number;
  error: number;
  checks: { check: string; verdict: string }[];
}

export function registerCommands(context: vscode.ExtensionContext, server: ServerManager): void {
  context.subscriptions.push(
    vscode.commands.registerCommand(Commands.showLogs, () => logChannel()?.show(true)),
    vscode.commands.registerCommand(Commands.restart, () => server.restart('requested by the user')),
    vscode.commands.registerCommand(Commands.verifyFullModel, () => verifyFullModel(server)),
    vscode.commands.registerCommand(OPEN_LOCATION_COMMAND, openLocation),
    vscode.commands.registerCommand(Commands.explainDiscrepancy, (explanation?: Explanation) =>
      explainDiscrepancy(server, explanation),
    ),
  );
}

function runningClient(server: ServerManager) {
  const client = server.client;
  if (!client || client.state !== State.Running) {
    void vscode.window.showWarningMessage('The shardproof server is not running (see "shardproof: Show Logs").');
    return undefined;
  }
  return client;
}

async function verifyFullModel(server: ServerManager): Promise<FullModelSummary | undefined> {
  const client = runningClient(server);
  if (!client) {
    return undefined;
  }
  const token = `shardproof-full-${Date.now()}`;
  const summary = await vscode.window.withProgress(
    { location: vscode.ProgressLocation.Notification, title: 'shardproof: Verify Full Model', cancellable: true },
    async (progress, cancellation) => {
      let last = 0;
      const listener = client.onProgress(WorkDoneProgress.type, token, (value) => {
        if (value.kind === 'report' || value.kind === 'begin') {
          const percentage = value.percentage ?? last;
          progress.report({ message: value.message, increment: Math.max(0, percentage - last) });
          last = percentage;
        }
      });
      const cancel = cancellation.onCancellationRequested(() => {
        void client.sendNotification(WorkDoneProgressCancelNotification.type, { token });
      });
      try {
        return (await client.sendRequest(ExecuteCommandRequest.type, {
          command: ServerCommands.verifyFullModel,
          arguments: [{ progressToken: token }],
        })) as FullModelSummary;
      } finally {
        listener.dispose();
        cancel.dispose();
      }
    },
  );
  if (summary) {
    const parts = [`${summary.verified} verified`, `${summary.discrepancy} with discrepancies`];
    if (summary.unproven) {
      parts.push(`${summary.unproven} unproven`);
    }
    if (summary.interrupted) {
      parts.push(`${summary.interrupted} interrupted by an edit`);
    }
    if (summary.inconclusive) {
      parts.push(`${summary.inconclusive} inconclusive`);
    }
    if (summary.error) {
      parts.push(`${summary.error} failed`);
    }
    const text = `shardproof: full model ${summary.cancelled ? 'cancelled' : 'verified'}: ${parts.join(', ')}.`;
    if (summary.discrepancy || summary.error || summary.unproven || summary.interrupted) {
      void vscode.window.showWarningMessage(text, 'Show Problems').then((choice) => {
        if (choice) {
          void vscode.commands.executeCommand('workbench.actions.view.problems');
        }
      });
    } else {
      void vscode.window.showInformationMessage(text);
    }
  }
  return summary;
}

async function explainDiscrepancy(server: ServerManager, explanation?: Explanation): Promise<void> {
  if (explanation && typeof explanation.markdown === 'string') {
    await showExplanation(explanation);
    return;
  }
  const client = runningClient(server);
  const editor = vscode.window.activeTextEditor;
  if (!client || !editor) {
    return;
  }
  const diagnostics = vscode.languages
    .getDiagnostics(editor.document.uri)
    .filter((d) => d.source === DIAGNOSTIC_SOURCE);
  const atCursor = diagnostics.find((d) => d.range.contains(editor.selection.active)) ?? diagnostics[0];
  if (!atCursor) {
    void vscode.window.showInformationMessage('shardproof: no discrepancy in this file.');
    return;
  }
  const code = typeof atCursor.code === 'object' ? atCursor.code.value : atCursor.code;
  const reply = (await client.sendRequest(ExecuteCommandRequest.type, {
    command: ServerCommands.explainDiscrepancy,
    arguments: [{ discrepancyIdFor: { line: atCursor.range.start.line, uri: editor.document.uri.toString(), code } }],
  })) as Explanation | null;
  if (reply) {
    await showExplanation(reply);
  } else {
    void vscode.window.showInformationMessage('shardproof: this diagnostic has no stored explanation; verify again.');
  }
}
