import * as vscode from 'vscode';
import {
  CloseAction,
  CloseHandlerResult,
  DidChangeConfigurationNotification,
  ErrorAction,
  ErrorHandlerResult,
  LanguageClient,
  LanguageClientOptions,
  RevealOutputChannelOn,
  ServerOptions,
  State,
  TransportKind,
} from 'vscode-languageclient/node';
import { Commands, Notifications, SERVER_MODULE } from './constants';
import { logChannel, traceError, traceInfo } from './logging';
import { bundledWheel, CPU_TORCH_INDEX, installCommand, runInstall } from './install';
import { checkShardproof, Interpreter, resolveInterpreter } from './python';
import { readServerSettings } from './settings';
import { StatusItem } from './status';

interface FinishedParams {
  check: string;
  mode?: string;
  verdict: string;
  discrepancies: number;
  unproven?: number;
  error?: string | null;
}

interface ProgressParams {
  check: string;
  mode?: string;
  world_size?: number;
  stage?: string;
  done?: number;
  total?: number;
  where?: string;
}

const CRASH_WINDOW_MS = 3 * 60 * 1000;
const MAX_RESTARTS = 3;

/**
 * Owns the language client. Restarts are single-flight: a restart requested while one runs is
 * queued once, so there are never two servers (the race the template's flag-and-delay lets through).
 */
export class ServerManager implements vscode.Disposable {
  client: LanguageClient | undefined;
  private restarting: Promise<void> | undefined;
  private restartQueued = false;
  private crashes: number[] = [];
  private readonly discrepancies = new Map<string, number>();
  private readonly unproven = new Map<string, number>();
  private readonly errors = new Set<string>();
  /** The checks whose shown result is from their quick configuration. */
  private readonly quick = new Set<string>();
  private disposables: vscode.Disposable[] = [];

  constructor(
    private readonly status: StatusItem,
    private readonly folder: () => vscode.WorkspaceFolder | undefined,
    private readonly extensionPath?: string,
  ) {}

  restart(reason: string): Promise<void> {
    if (this.restarting) {
      this.restartQueued = true;
      return this.restarting;
    }
    this.restarting = (async () => {
      try {
        do {
          this.restartQueued = false;
          traceInfo(`(re)starting the server: ${reason}`);
          await this.stop();
          await this.start();
        } while (this.restartQueued);
      } finally {
        this.restarting = undefined;
      }
    })();
    return this.restarting;
  }

  private async start(): Promise<void> {
    const folder = this.folder();
    this.status.set({ kind: 'starting' });
    const interpreter = await resolveInterpreter(folder);
    traceInfo(`interpreter: ${[interpreter.command, ...interpreter.args].join(' ')} (from ${interpreter.source})`);
    const check = await checkShardproof(interpreter);
    if (!check.ok) {
      this.reportNotInstalled(interpreter, check.detail);
      return;
    }
    const client = new LanguageClient('shardproof', 'shardproof', this.serverOptions(interpreter, folder),
      this.clientOptions(folder));
    this.client = client;
    this.disposables.push(
      client.onDidChangeState((event) => {
        traceInfo(`server state: ${State[event.oldState]} -> ${State[event.newState]}`);
      }),
      client.onNotification(Notifications.workerStateChanged, (params: { state: string; detail: string }) => {
        if (params.state === 'crashed') {
          this.status.set({ kind: 'error', message: `worker ${params.detail}` });
        } else if (params.state === 'starting' || params.state === 'restarting') {
          this.status.set({ kind: 'starting' });
        }
      }),
      client.onNotification(Notifications.verificationStarted, (params: { check: string; mode: string }) => {
        this.status.set({ kind: 'verifying', check: params.check, mode: params.mode });
      }),
      client.onNotification(Notifications.progress, (params: ProgressParams) => {
        const percentage = params.total ? Math.round((100 * (params.done ?? 0)) / params.total) : undefined;
        this.status.set({
          kind: 'verifying',
          check: params.check,
          mode: params.mode,
          worldSize: params.world_size || undefined,
          stage: params.stage || undefined,
          where: params.where,
          percentage,
        });
      }),
      client.onNotification(Notifications.verificationFinished, (params: FinishedParams) => {
        this.discrepancies.set(params.check, params.discrepancies);
        this.unproven.set(params.check, params.unproven ?? 0);
        if (params.mode === 'quick') {
          this.quick.add(params.check);
        } else {
          this.quick.delete(params.check);
        }
        if (params.verdict === 'error' || params.verdict === 'inconclusive') {
          this.errors.add(params.check);
        } else {
          this.errors.delete(params.check);
        }
        this.showSummary();
      }),
    );
    try {
      await client.start();
      this.showSummary();
    } catch (error) {
      traceError(`the server did not start: ${String(error)}`);
      this.status.set({ kind: 'error', message: 'the server did not start' });
    }
  }

  private showSummary(): void {
    const total = [...this.discrepancies.values()].reduce((sum, n) => sum + n, 0);
    const unproven = [...this.unproven.values()].reduce((sum, n) => sum + n, 0);
    const quick = [...this.quick];
    if (total > 0 || unproven > 0) {
      this.status.set({ kind: 'findings', discrepancies: total, unproven, quick });
    } else if (this.errors.size > 0) {
      this.status.set({ kind: 'error', message: `not verified: ${[...this.errors].join(', ')}` });
    } else {
      this.status.set({ kind: 'idle', quick });
    }
  }

  private reportNotInstalled(interpreter: Interpreter, detail: string): void {
    const wheel = this.extensionPath ? bundledWheel(this.extensionPath) : undefined;
    const command = installCommand(interpreter, wheel);
    traceError(`shardproof is not importable by ${interpreter.command}: ${detail}`);
    this.status.set({ kind: 'error', message: `shardproof is not installed for ${interpreter.command}` });
    const actions = wheel ? ['Install', 'Copy Install Command', 'Show Logs'] : ['Copy Install Command', 'Show Logs'];
    void vscode.window
      .showErrorMessage(
        `shardproof is not installed for ${interpreter.command}. ` +
          (wheel ? 'Install the server that comes with this extension: ' : 'Install it from a clone: ') +
          `${command} (it needs torch 2.13; where only PyPI is reachable pip takes its CUDA build, several GB: ` +
          `add --extra-index-url ${CPU_TORCH_INDEX} for the CPU build). Or choose another interpreter with ` +
          'the shardproof.interpreter setting.',
        ...actions,
      )
      .then(async (choice) => {
        if (choice === 'Install') {
          runInstall(command);
        } else if (choice === 'Copy Install Command') {
          await vscode.env.clipboard.writeText(command);
        } else if (choice === 'Show Logs') {
          await vscode.commands.executeCommand(Commands.showLogs);
        }
      });
  }

  private serverOptions(interpreter: Interpreter, folder?: vscode.WorkspaceFolder): ServerOptions {
    const settings = readServerSettings(folder);
    return {
      command: interpreter.command,
      args: [...interpreter.args, '-m', SERVER_MODULE],
      transport: TransportKind.stdio,
      options: {
        cwd: folder?.uri.fsPath,
        env: { ...process.env, SHARDPROOF_LOG_LEVEL: settings.logLevel.toUpperCase() },
      },
    };
  }

  private clientOptions(folder?: vscode.WorkspaceFolder): LanguageClientOptions {
    return {
      documentSelector: [
        { scheme: 'file', language: 'python' },
        { scheme: 'file', pattern: '**/pyproject.toml' },
      ],
      outputChannel: logChannel(),
      revealOutputChannelOn: RevealOutputChannelOn.Never,
      initializationOptions: readServerSettings(folder),
      synchronize: {
        fileEvents: vscode.workspace.createFileSystemWatcher('**/{*.py,pyproject.toml}'),
      },
      errorHandler: {
        error: (): ErrorHandlerResult => ({ action: ErrorAction.Continue }),
        closed: (): CloseHandlerResult => this.onServerClosed(),
      },
    };
  }

  private onServerClosed(): CloseHandlerResult {
    const now = Date.now();
    this.crashes = this.crashes.filter((time) => now - time < CRASH_WINDOW_MS);
    this.crashes.push(now);
    const restart = this.crashes.length <= MAX_RESTARTS;
    this.status.set({ kind: 'error', message: 'the server stopped' });
    void vscode.window
      .showErrorMessage(
        restart
          ? 'The shardproof server stopped unexpectedly; it is being restarted.'
          : `The shardproof server stopped ${this.crashes.length} times in 3 minutes and will not be restarted ` +
              'automatically (run "shardproof: Restart Server").',
        'Show Logs',
      )
      .then((choice) => {
        if (choice === 'Show Logs') {
          void vscode.commands.executeCommand(Commands.showLogs);
        }
      });
    return { action: restart ? CloseAction.Restart : CloseAction.DoNotRestart };
  }

  /** Settings that do not need a new process go to the running server. */
  async sendSettings(): Promise<void> {
    if (this.client?.state === State.Running) {
      await this.client.sendNotification(DidChangeConfigurationNotification.type, {
        settings: { shardproof: readServerSettings(this.folder()) },
      });
    }
  }

  async stop(): Promise<void> {
    const client = this.client;
    this.client = undefined;
    for (const disposable of this.disposables) {
      disposable.dispose();
    }
    this.disposables = [];
    if (client) {
      try {
        await client.stop(10000);
      } catch (error) {
        traceError(`stopping the server: ${String(error)}`);
      }
    }
    this.status.set({ kind: 'off' });
  }

  dispose(): void {
    void this.stop();
  }
}
