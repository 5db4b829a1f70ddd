// Shared pieces of the real-VS-Code scenarios: the browser, numbered screenshots, named steps with
// a report line each, and the few workbench gestures the scenarios need.
'use strict';
const fs = require('fs');
const path = require('path');
const { chromium } = require('playwright-core');

const SHOTS = process.env.SHOTS;
const results = [];
let shot = 0;

async function screenshot(page, name) {
  shot += 1;
  await page.waitForTimeout(400); // toasts and hovers slide in
  await page.screenshot({ path: path.join(SHOTS, `${String(shot).padStart(2, '0')}-${name}.png`) });
}

async function step(name, page, body) {
  const started = Date.now();
  try {
    await body();
    results.push({ name, ok: true });
    console.log(`ok   ${name} (${((Date.now() - started) / 1000).toFixed(1)} s)`);
  } catch (error) {
    results.push({ name, ok: false });
    console.log(`FAIL ${name}: ${error && error.message ? error.message.split('\n')[0] : error}`);
    await page.screenshot({ path: path.join(SHOTS, `failed-${name.replace(/\W+/g, '-')}.png`) }).catch(() => {});
    throw error;
  }
}

function activeLineNumber(page, line) {
  return page
    .locator('.monaco-editor .line-numbers.active-line-number')
    .filter({ hasText: new RegExp(`^\\s*${line}\\s*$`) })
    .first();
}

/** The lines (by their gutter numbers) that each box's vertical centre falls on, for reports. */
async function linesOf(page, boxes) {
  const gutter = await page.locator('.monaco-editor .line-numbers').evaluateAll((nodes) =>
    nodes.map((node) => {
      const rect = node.getBoundingClientRect();
      return { text: node.textContent.trim(), top: rect.top, bottom: rect.bottom };
    }),
  );
  return boxes.map((box) => {
    const middle = box.y + box.height / 2;
    const row = gutter.find((entry) => entry.top <= middle && middle <= entry.bottom);
    return row ? row.text : '?';
  });
}

/**
 * The squiggle of `kind` ("error", "warning") on `line`, which must be the active line, and its
 * box as measured when it was found ({ squiggle, box }). Polls, because the editor may still be
 * laying out (a scroll, a hover closing) while decorations land: two reads of one moment, not a
 * single read of two moments. The box is returned rather than read again by the caller: the
 * decorations may be laid out anew in between, and an nth() locator then has no box. On a timeout
 * the error names the lines the squiggles of that kind are on.
 */
async function squiggleOnLine(page, kind, line, timeout = 60000) {
  const squiggles = page.locator(`.monaco-editor .squiggly-${kind}`);
  await squiggles.first().waitFor({ state: 'attached', timeout });
  const deadline = Date.now() + timeout;
  let boxes = [];
  for (;;) {
    const current = await activeLineNumber(page, line).boundingBox();
    boxes = [];
    for (let i = 0, n = await squiggles.count(); i < n; i += 1) {
      const box = await squiggles.nth(i).boundingBox();
      if (box) boxes.push(box);
      if (box && current && Math.abs(box.y + box.height / 2 - (current.y + current.height / 2)) <= current.height / 2) {
        return { squiggle: squiggles.nth(i), box };
      }
    }
    if (Date.now() > deadline) break;
    await page.waitForTimeout(250);
  }
  const lines = await linesOf(page, boxes);
  throw new Error(`the ${kind} is not on line ${line} (${kind} squiggles on lines: ${lines.join(', ') || 'none'})`);
}

async function goToLine(page, line) {
  await page.keyboard.press('Control+g');
  const widget = page.locator('.quick-input-widget');
  const input = widget.locator('input').first();
  await input.waitFor();
  await input.fill(`:${line}`);
  await widget.getByText(`Go to line ${line}`).first().waitFor();
  await page.keyboard.press('Enter');
  await widget.waitFor({ state: 'hidden' });
  await activeLineNumber(page, line).waitFor();
}

function statusItem(page) {
  return page.locator('.statusbar-item', { hasText: 'shardproof' }).first();
}

/** The status item while a verification runs (its spinning sync icon), optionally showing `text`. */
function statusVerifying(page, text) {
  const item = statusItem(page).filter({ has: page.locator('.codicon-sync') });
  return text ? item.filter({ hasText: text }) : item;
}

/** The status item showing a verdict: no verification running, and not starting. */
function statusSettled(page) {
  return statusItem(page).filter({ hasNot: page.locator('.codicon-sync') }).filter({ hasNot: page.locator('.codicon-loading') });
}

/** Run a command from the palette by its title ("shardproof: Restart Server"). */
async function runCommand(page, title) {
  await page.keyboard.press('F1');
  const widget = page.locator('.quick-input-widget');
  await widget.locator('input').first().waitFor();
  await page.keyboard.type(title);
  await widget.locator('.monaco-list-row', { hasText: title.split(': ').pop() }).first().waitFor();
  await page.keyboard.press('Enter');
  await widget.waitFor({ state: 'hidden' });
}

async function openFile(page, name) {
  await page.keyboard.press('Control+p');
  await page.waitForSelector('.quick-input-widget input');
  await page.keyboard.type(name);
  await page.locator('.quick-input-list .monaco-list-row', { hasText: name }).first().waitFor();
  await page.keyboard.press('Enter');
  await page.locator('.tabs-container .tab.active', { hasText: name }).first().waitFor();
}

/** Launch chromium, run `scenario(page)`, print "N passed, M failed" and exit accordingly. */
async function run(scenario) {
  fs.mkdirSync(SHOTS, { recursive: true });
  const profile = fs.mkdtempSync(path.join(process.env.TMPDIR || '/tmp', 'chromium-'));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM_BIN,
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync'],
    viewport: { width: 1500, height: 950 },
  });
  const page = context.pages()[0] || (await context.newPage());
  page.setDefaultTimeout(30000);
  try {
    await scenario(page);
  } catch {
    // the failed step is recorded; go on to the report
  } finally {
    await context.close();
    fs.rmSync(profile, { recursive: true, force: true });
  }
  const passed = results.filter((r) => r.ok).length;
  const failed = results.length - passed;
  console.log(`${passed} passed, ${failed} failed`);
  process.exit(failed === 0 && passed > 0 ? 0 : 1);
}

function main(scenario) {
  run(scenario).catch((error) => {
    console.log(`FAIL harness: ${error}`);
    console.log('0 passed, 1 failed');
    process.exit(1);
  });
}

module.exports = {
  activeLineNumber,
  goToLine,
  main,
  openFile,
  runCommand,
  screenshot,
  squiggleOnLine,
  statusItem,
  statusSettled,
  statusVerifying,
  step,
};
