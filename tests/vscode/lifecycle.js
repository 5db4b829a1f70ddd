// The extension's lifecycle in real VS Code (code-server), on the missing-all-reduce variant:
//   an untrusted workspace starts nothing; trusting it starts the extension;
//   an interpreter without shardproof -> an error naming the install command of the bundled wheel,
//   with an Install button;
//   choosing an interpreter that has it -> a restart and diagnostics;
//   a setting that needs no restart reaches the running server (same process);
//   "Restart Server" twice in a row -> still exactly one server;
//   the server killed -> an error with "Show Logs", the logs, and a new server.
// Every step saves a screenshot to $SHOTS. Prints "N passed, M failed"; exits 1 on a failure.
'use strict';
const fs = require('fs');
const path = require('path');
const { main, runCommand, screenshot, statusItem, step } = require('./harness');

const URL = process.env.CS_URL;
const WS = fs.realpathSync(process.env.CS_WS);
const USER_DATA = process.env.CS_USER_DATA;
const PYTHON = process.env.SERVER_PYTHON;
const BARE_PYTHON = process.env.BARE_PYTHON;
const SETTINGS = path.join(USER_DATA, 'User', 'settings.json');

/** PIDs of shardproof language servers working on this workspace (its cwd). */
function serverPids() {
  const pids = [];
  for (const entry of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) {
      continue;
    }
    try {
      const argv = fs.readFileSync(`/proc/${entry}/cmdline`, 'utf8').split('\0');
      const module = argv.indexOf('-m');
      if (module >= 0 && argv[module + 1] === 'shardproof.server' && fs.realpathSync(`/proc/${entry}/cwd`) === WS) {
        pids.push(Number(entry));
      }
    } catch {
      // the process ended while we looked
    }
  }
  return pids;
}

async function exactlyOneServer(page, previous) {
  let pids = [];
  for (let i = 0; i < 60; i += 1) {
    pids = serverPids();
    if (pids.length === 1 && pids[0] !== previous) {
      await page.waitForTimeout(2000); // a second server would have appeared by now
      pids = serverPids();
      break;
    }
    await page.waitForTimeout(500);
  }
  if (pids.length !== 1) {
    throw new Error(`expected one shardproof server, found ${pids.length} (${pids.join(', ')})`);
  }
  if (previous !== undefined && pids[0] === previous) {
    throw new Error('the server was not restarted');
  }
  return pids[0];
}

/** Change user settings the way a user does: edit settings.json in the editor and save it. */
async function changeSettings(page, changes) {
  const text = fs.readFileSync(SETTINGS, 'utf8');
  let current;
  try { current = JSON.parse(text); } catch (e) { throw new Error(`settings.json: ${e.message}: ${JSON.stringify(text)}`); }
  const settings = { ...current, ...changes };
  await runCommand(page, 'Preferences: Open User Settings (JSON)');
  await page.locator('.tabs-container .tab.active', { hasText: 'settings.json' }).first().waitFor();
  await page.locator('.editor-group-container.active .monaco-editor .view-lines').first().click();
  await page.keyboard.press('Control+a');
  await page.keyboard.insertText(JSON.stringify(settings, null, 2));
  // The JSON editor may auto-close the first brace: drop whatever follows the cursor.
  await page.keyboard.press('Control+Shift+End');
  await page.keyboard.press('Delete');
  await page.keyboard.press('Control+s');
  await page.locator('.tabs-container .tab.active.dirty', { hasText: 'settings.json' }).waitFor({ state: 'detached' });
  await page.keyboard.press('Control+w');
}

/** The text of the extension's log channel (VS Code writes every output channel to a file). */
function channelLog() {
  const found = [];
  const walk = (dir) => {
    for (const entry of fs.readdirSync(dir, { withFileTypes: true })) {
      const full = path.join(dir, entry.name);
      if (entry.isDirectory()) {
        walk(full);
      } else if (/shardproof\.log$/.test(entry.name)) {
        found.push(full);
      }
    }
  };
  walk(path.join(USER_DATA, 'logs'));
  return found.map((file) => fs.readFileSync(file, 'utf8')).join('\n');
}

function toast(page, text) {
  return page.locator('.notifications-toasts .notification-toast', { hasText: text }).first();
}

main(async (page) => {
  await step('an untrusted workspace starts nothing', page, async () => {
    await page.goto(`${URL}/?folder=${encodeURIComponent(WS)}`);
    await page.waitForSelector('.monaco-workbench', { timeout: 60000 });
    const dialog = page.locator('.monaco-dialog-box', { hasText: 'Do you trust the authors' });
    await dialog.waitFor({ timeout: 60000 });
    await screenshot(page, 'trust-prompt');
    await dialog.getByRole('button', { name: "No, I don't trust the authors" }).click();
    await page.waitForTimeout(5000);
    if (serverPids().length !== 0) {
      throw new Error('a shardproof server runs in an untrusted workspace');
    }
    if ((await page.locator('.statusbar-item', { hasText: 'shardproof' }).count()) !== 0) {
      throw new Error('the shardproof status item is shown in an untrusted workspace');
    }
    await screenshot(page, 'restricted-mode');
  });

  await step('trusting the workspace starts the extension; an interpreter without shardproof is named', page, async () => {
    await runCommand(page, 'Workspaces: Manage Workspace Trust');
    await page.getByRole('button', { name: 'Trust', exact: true }).first().click();
    const error = toast(page, 'shardproof is not installed for');
    await error.waitFor({ timeout: 60000 });
    const text = await error.textContent();
    // the install command names the server wheel the .vsix carries (bundled/shardproof-*.whl)
    if (!text.includes(BARE_PYTHON) || !/-m pip install \S*bundled\/shardproof-[^ ]*\.whl/.test(text)) {
      throw new Error(`the message does not name the interpreter and the bundled wheel's install command: ${text}`);
    }
    if (!text.includes('download.pytorch.org/whl/cpu')) {
      throw new Error(`the message does not say where torch's CPU build comes from: ${text}`);
    }
    await error.getByRole('button', { name: 'Install', exact: true }).waitFor();
    await statusItem(page).filter({ hasText: 'error' }).waitFor();
    await screenshot(page, 'not-installed');
    if (serverPids().length !== 0) {
      throw new Error('a server was started with an interpreter that lacks shardproof');
    }
  });

  let pid;
  await step('choosing an interpreter that has shardproof restarts the server', page, async () => {
    await page.locator('.notifications-toasts .codicon-notifications-clear').first().click().catch(() => {});
    await changeSettings(page, { 'shardproof.interpreter': [PYTHON] });
    // this scenario's settings ask for the quick configuration: the verdict says it is from it
    await statusItem(page).filter({ hasText: '1 discrepancy (quick)' }).waitFor({ timeout: 120000 });
    pid = await exactlyOneServer(page);
    await screenshot(page, 'interpreter-chosen');
  });

  await step('a setting that needs no restart reaches the running server', page, async () => {
    await changeSettings(page, { 'shardproof.debounceMs': 432 });
    for (let i = 0; i < 40 && !/debounce_ms=432/.test(channelLog()); i += 1) {
      await page.waitForTimeout(250);
    }
    if (!/settings changed: .*debounce_ms=432/.test(channelLog())) {
      throw new Error('the server did not receive the new debounce setting');
    }
    if (JSON.stringify(serverPids()) !== JSON.stringify([pid])) {
      throw new Error('the server was restarted for a setting that does not need it');
    }
  });

  await step('"Restart Server" twice in a row leaves exactly one server', page, async () => {
    await runCommand(page, 'shardproof: Restart Server');
    await runCommand(page, 'shardproof: Restart Server');
    await statusItem(page).filter({ hasText: '1 discrepancy' }).waitFor({ timeout: 120000 });
    pid = await exactlyOneServer(page, pid);
    await screenshot(page, 'restarted');
  });

  await step('a server crash shows an error with "Show Logs"; a new server takes over', page, async () => {
    process.kill(pid, 'SIGKILL');
    const error = toast(page, 'stopped unexpectedly');
    await error.waitFor({ timeout: 30000 });
    await screenshot(page, 'crash-message');
    await error.getByRole('button', { name: 'Show Logs' }).click();
    await page.locator('.panel .monaco-editor', { hasText: 'server state' }).first().waitFor();
    await screenshot(page, 'logs');
    await statusItem(page).filter({ hasText: '1 discrepancy' }).waitFor({ timeout: 120000 });
    pid = await exactlyOneServer(page, pid);
  });
});
