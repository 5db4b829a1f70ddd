// The shardproof extension in real VS Code (code-server), driven by playwright-core in Debian's
// chromium. Scenario on the missing-all-reduce variant of the bundled example:
//   squiggle at the line of the mistake, hover, Problems panel, status item;
//   Ctrl+. -> "Explain discrepancy" -> the explanation appears;
//   fix the line by typing -> the squiggle disappears;
//   "shardproof: Verify Full Model" from the palette -> progress notification, then a summary.
// Every step saves a screenshot to $SHOTS. Prints "N passed, M failed"; exits 1 on a failure.
'use strict';
const fs = require('fs');
const path = require('path');
const { chromium } = require('playwright-core');

const URL = process.env.CS_URL;
const WS = process.env.CS_WS;
const SHOTS = process.env.SHOTS;
const MISTAKE_LINE = 78;
const FIX = 'return reduce_from_tp(F.linear(x, self.weight)) + self.bias';

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

function activeLineNumber(page, line) {
  return page.locator('.monaco-editor .line-numbers.active-line-number').filter({ hasText: new RegExp(`^\\s*${line}\\s*$`) }).first();
}

function statusItem(page) {
  return page.locator('.statusbar-item', { hasText: 'shardproof' }).first();
}

async function main() {
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
    await step('workbench opens on the workspace', page, async () => {
      await page.goto(`${URL}/?folder=${encodeURIComponent(WS)}`);
      await page.waitForSelector('.monaco-workbench', { timeout: 60000 });
      await page.waitForTimeout(1500);
      await page.locator('.monaco-workbench').click({ position: { x: 700, y: 400 } });
    });

    await step('the parallel file opens', page, async () => {
      await page.keyboard.press('Control+p');
      await page.waitForSelector('.quick-input-widget input');
      await page.keyboard.type('tp.py');
      await page.locator('.quick-input-list .monaco-list-row', { hasText: 'tp.py' }).first().waitFor();
      await page.keyboard.press('Enter');
      await page.locator('.tabs-container .tab', { hasText: 'tp.py' }).first().waitFor();
      await goToLine(page, MISTAKE_LINE);
    });

    let squiggle;
    await step('a squiggle appears at the line of the mistake', page, async () => {
      squiggle = page.locator('.monaco-editor .squiggly-error').first();
      await squiggle.waitFor({ state: 'attached', timeout: 120000 });
      const box = await squiggle.boundingBox();
      const current = await activeLineNumber(page, MISTAKE_LINE).boundingBox();
      if (!box || !current || Math.abs(box.y + box.height / 2 - (current.y + current.height / 2)) > current.height) {
        throw new Error(`the squiggle is not on line ${MISTAKE_LINE}`);
      }
      await screenshot(page, 'squiggle');
    });

    await step('the status item counts the discrepancy', page, async () => {
      await statusItem(page).filter({ hasText: '1 discrepancy' }).waitFor({ timeout: 60000 });
      await screenshot(page, 'status-discrepancy');
    });

    await step('hovering shows the message', page, async () => {
      const box = await squiggle.boundingBox();
      await page.mouse.move(box.x + box.width / 2, box.y + box.height / 2);
      await page.locator('.monaco-hover:not(.hidden)', { hasText: 'without an all-reduce' }).first().waitFor();
      await screenshot(page, 'hover');
    });

    await step('the Problems panel lists it', page, async () => {
      await page.keyboard.press('Control+Shift+m');
      const panel = page.locator('.markers-panel');
      await panel.getByText('without an all-reduce').first().waitFor();
      await panel.getByText(`[Ln ${MISTAKE_LINE}`).first().waitFor();
      await screenshot(page, 'problems');
    });

    await step('Ctrl+. offers "Explain discrepancy" and the explanation appears', page, async () => {
      const box = await squiggle.boundingBox();
      await page.mouse.click(box.x + box.width / 2, box.y + box.height / 2);
      await page.keyboard.press('Control+.');
      const widget = page.locator('.action-widget');
      await widget.getByText('Explain discrepancy').first().waitFor();
      await widget.getByText('Insert the missing all-reduce').first().waitFor();
      await screenshot(page, 'code-actions');
      for (let i = 0; i < 6; i += 1) {
        const focused = await widget.locator('.monaco-list-row.focused').first().textContent();
        if (focused && focused.includes('Explain discrepancy')) {
          break;
        }
        await page.keyboard.press('ArrowDown');
      }
      await page.keyboard.press('Enter');
      await page.locator('.tabs-container .tab', { hasText: 'shardproof: missing-reduction' }).first().waitFor();
      let found = false;
      for (let i = 0; i < 40 && !found; i += 1) {
        for (const frame of page.frames()) {
          if ((await frame.locator('body.shardproof-explanation').count().catch(() => 0)) > 0) {
            await frame.getByText('What the reference computes').first().waitFor({ timeout: 5000 });
            if ((await frame.locator('svg').count()) < 1) {
              throw new Error('the explanation has no picture');
            }
            found = true;
            break;
          }
        }
        if (!found) {
          await page.waitForTimeout(250);
        }
      }
      if (!found) {
        throw new Error('the explanation webview did not render');
      }
      await screenshot(page, 'explanation');
    });

    await step('typing the fix makes the squiggle disappear', page, async () => {
      await page.keyboard.press('Control+1');
      await goToLine(page, MISTAKE_LINE);
      await page.keyboard.press('End');
      await page.keyboard.press('Shift+Home');
      await page.keyboard.type(FIX, { delay: 5 });
      await screenshot(page, 'typed-fix');
      await page.locator('.monaco-editor .squiggly-error').first().waitFor({ state: 'detached', timeout: 120000 });
      await statusItem(page).filter({ hasNotText: 'discrepanc' }).filter({ hasNotText: 'verifying' }).waitFor({
        timeout: 60000,
      });
      await screenshot(page, 'fixed-status-idle');
    });

    await step('"Verify Full Model" shows progress, then a summary', page, async () => {
      await page.keyboard.press('F1');
      await page.waitForSelector('.quick-input-widget input');
      await page.keyboard.type('shardproof: Verify Full Model');
      await page.locator('.quick-input-list .monaco-list-row', { hasText: 'Verify Full Model' }).first().waitFor();
      await page.keyboard.press('Enter');
      await page.locator('.notifications-toasts', { hasText: 'Verify Full Model' }).first().waitFor();
      await statusItem(page).filter({ hasText: 'verifying' }).waitFor({ timeout: 60000 });
      await screenshot(page, 'full-model-progress');
      await page.locator('.notifications-toasts', { hasText: 'full model verified: 1 verified' }).first().waitFor({
        timeout: 300000,
      });
      await screenshot(page, 'full-model-summary');
      await statusItem(page).filter({ hasNotText: 'verifying' }).filter({ hasNotText: 'discrepanc' }).waitFor();
    });
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

main().catch((error) => {
  console.log(`FAIL harness: ${error}`);
  console.log('0 passed, 1 failed');
  process.exit(1);
});
