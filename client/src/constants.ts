// Ids shared by the client modules. Server command ids differ from the palette ids: the language
// client registers the server's `executeCommandProvider` commands itself.

export const EXTENSION_NAME = 'shardproof';
export const SETTINGS_SECTION = 'shardproof';
export const SERVER_MODULE = 'shardproof.server';

export const Commands = {
  verifyFullModel: 'shardproof.verifyFullModel',
  explainDiscrepancy: 'shardproof.explainDiscrepancy',
  restart: 'shardproof.restart',
  showLogs: 'shardproof.showLogs',
} as const;

export const ServerCommands = {
  verifyFullModel: 'shardproof.server.verifyFullModel',
  explainDiscrepancy: 'shardproof.server.explainDiscrepancy',
} as const;

export const Notifications = {
  workerStateChanged: 'shardproof/workerStateChanged',
  verificationStarted: 'shardproof/verificationStarted',
  verificationFinished: 'shardproof/verificationFinished',
  progress: 'shardproof/progress',
} as const;

export const DIAGNOSTIC_SOURCE = 'shardproof';
