// The shardproof extension in real VS Code (code-server), driven by playwright-core in Debian's
// chromium. Scenario on the missing-all-reduce variant of the bundled example:
//   the editor verifies the full declaration (the check declares a quick table too): the status
//   item shows the cold run's progress (check, world size, stage), then the verdict;
//   squiggle at the line of the mistake, hover, Problems panel, status item;
//   Ctrl+. -> "Explain discrepancy" -> the explanation appears;
//   fix the line by typing -> the squiggle disappears, the explanation says it is no longer reported;
//   "shardproof: Verify Full Model" from the palette -> progress notification, then a summary;
//   a second check, correct but not proven by the rules -> a Warning squiggle whose hover says
//   what the numeric witness found, and the explanation of an unproven finding.
// Every step saves a screenshot to $SHOTS. Prints "N passed, M failed"; exits 1 on a failure.
'use strict';
const {
  goToLine, main, openFile, runCommand, screenshot, squiggleOnLine, statusItem, statusSettled, statusVerifying, step,
} = require('./harness');

const URL = process.env.CS_URL;
const WS = process.env.CS_WS;
const MISTAKE_LINE = 78;
const REFERENCE_LINE = 104; // llama_example/model.py: the reference's wo call
const FIX = 'return reduce_from_tp(F.linear(x, self.weight)) + self.bias';
const UNPROVEN_LINE = Number(process.env.UNPROVEN_LINE); // tinymlp/parallel.py: the gathered-sum check

main(async (page) => {
  await step('workbench opens on the workspace', page, async () => {
    await page.goto(`${URL}/?folder=${encodeURIComponent(WS)}`);
    await page.waitForSelector('.monaco-workbench', { timeout: 60000 });
    await page.waitForTimeout(1500);
    await page.locator('.monaco-workbench').click({ position: { x: 700, y: 400 } });
  });

  await step('the parallel file opens', page, async () => {
    await openFile(page, 'tp.py');
    await goToLine(page, MISTAKE_LINE);
  });

  await step("the status item shows the cold run's progress on the full declaration", page, async () => {
    // "llama-tp-missing-all-reduce, world size 4: capturing rank 3 of 4 · 40%"; a run of the
    // quick configuration would say "(quick)" after the check's name
    await statusVerifying(page, /llama-tp-missing-all-reduce, world size \d: \S/).waitFor({ timeout: 120000 });
    const text = await statusItem(page).textContent();
    if (text.includes('(quick)')) {
      throw new Error(`the editor verifies the quick configuration by default: ${text}`);
    }
    await screenshot(page, 'status-progress');
  });

  let mistake; // { squiggle, box } as first found
  await step('a squiggle appears at the line of the mistake', page, async () => {
    mistake = await squiggleOnLine(page, 'error', MISTAKE_LINE, 120000);
    await screenshot(page, 'squiggle');
  });

  await step('the status item counts the discrepancy', page, async () => {
    await statusSettled(page).filter({ hasText: '1 discrepancy' }).waitFor({ timeout: 120000 });
    const text = await statusItem(page).textContent();
    if (text.includes('(quick)')) {
      throw new Error(`the verdict is from the quick configuration: ${text}`);
    }
    await screenshot(page, 'status-discrepancy');
  });

  await step('hovering shows the message', page, async () => {
    const { box } = await squiggleOnLine(page, 'error', MISTAKE_LINE);
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
    // (laid out anew since it was found, the squiggle may have no box this moment: where it was)
    const box = (await mistake.squiggle.boundingBox()) ?? mistake.box;
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
          const siteLink = frame.locator('a[href^="command:shardproof.openLocation"]', { hasText: 'model.py:' });
          if ((await siteLink.count()) < 1) {
            throw new Error('the explanation does not link its code sites');
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

  await step("the explanation's code-site link opens the reference line", page, async () => {
    let link;
    for (const frame of page.frames()) {
      if ((await frame.locator('body.shardproof-explanation').count().catch(() => 0)) > 0) {
        link = frame.locator('a[href^="command:shardproof.openLocation"]', { hasText: 'model.py:' }).first();
      }
    }
    await link.click();
    await page.locator('.tabs-container .tab.active', { hasText: 'model.py' }).first().waitFor();
    await page.locator('.line-numbers.active-line-number', { hasText: String(REFERENCE_LINE) }).first().waitFor();
    await screenshot(page, 'explanation-link');
    await page.locator('.tabs-container .tab', { hasText: 'tp.py' }).first().click();
    await page.locator('.tabs-container .tab.active', { hasText: 'tp.py' }).first().waitFor();
  });

  await step('typing the fix makes the squiggle disappear', page, async () => {
    await page.keyboard.press('Control+1');
    await goToLine(page, MISTAKE_LINE);
    await page.keyboard.press('End');
    await page.keyboard.press('Shift+Home');
    await page.keyboard.type(FIX, { delay: 5 });
    await screenshot(page, 'typed-fix');
    await page.locator('.monaco-editor .squiggly-error').first().waitFor({ state: 'detached', timeout: 120000 });
    // the open explanation says its finding is no longer reported
    await page.locator('.tabs-container .tab', { hasText: 'no longer reported' }).first().waitFor({ timeout: 30000 });
    await statusSettled(page).filter({ hasNotText: 'discrepanc' }).waitFor({ timeout: 120000 });
    await screenshot(page, 'fixed-status-idle');
  });

  await step('"Verify Full Model" shows progress, then a summary', page, async () => {
    await runCommand(page, 'shardproof: Verify Full Model');
    await page.locator('.notifications-toasts', { hasText: 'Verify Full Model' }).first().waitFor();
    await statusVerifying(page, /world size \d+: \S/).waitFor({ timeout: 60000 });
    await screenshot(page, 'full-model-progress');
    await page.locator('.notifications-toasts', { hasText: 'full model verified: 1 verified' }).first().waitFor({
      timeout: 300000,
    });
    await screenshot(page, 'full-model-summary');
    await statusSettled(page).filter({ hasNotText: 'discrepanc' }).waitFor();
  });

  await step('a correct program the rules cannot prove is an unproven Warning, not an error', page, async () => {
    await statusItem(page).filter({ hasText: '1 unproven' }).waitFor({ timeout: 60000 });
    await openFile(page, 'parallel.py');
    await goToLine(page, UNPROVEN_LINE);
    const { box } = await squiggleOnLine(page, 'warning', UNPROVEN_LINE, 120000);
    if ((await page.locator('.monaco-editor .squiggly-error').count()) > 0) {
      throw new Error('a correct program shows an error squiggle');
    }
    await page.mouse.move(box.x + box.width / 2, box.y + box.height / 2);
    const hover = page.locator('.monaco-hover:not(.hidden)', { hasText: 'not proven' }).first();
    await hover.waitFor();
    await hover.getByText('no difference found', { exact: false }).first().waitFor();
    await screenshot(page, 'unproven-warning');
  });
});
