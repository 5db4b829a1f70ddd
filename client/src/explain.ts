import * as vscode from 'vscode';

export interface Explanation {
  discrepancyId: string;
  check: string;
  kind: string;
  verdict?: string;
  worldSizes: number[];
  markdown: string;
  svg?: string;
}

let panel: vscode.WebviewPanel | undefined;
let shown: { explanation: Explanation; html: string } | undefined;
let watcher: vscode.Disposable | undefined;

/** Whether any shardproof diagnostic still carries this finding's id (languageclient keeps `data`). */
function stillReported(discrepancyId: string): boolean {
  return vscode.languages
    .getDiagnostics()
    .some(([, diagnostics]) =>
      diagnostics.some((d) => {
        const data = (d as { data?: { discrepancyId?: string } }).data;
        return d.source === 'shardproof' && data?.discrepancyId === discrepancyId;
      }),
    );
}

/** Mark the open explanation once its finding is no longer reported (fixed, or the code changed). */
function watchResolution(): void {
  watcher?.dispose();
  watcher = vscode.languages.onDidChangeDiagnostics(() => {
    if (!panel || !shown || stillReported(shown.explanation.discrepancyId)) {
      return;
    }
    panel.title = `shardproof: ${shown.explanation.kind} (no longer reported)`;
    const banner =
      '<p class="resolved"><strong>No longer reported.</strong> The code changed and shardproof no longer ' +
      'finds this; the explanation below is of the earlier version.</p>';
    panel.webview.html = page(banner + shown.html, shown.explanation.svg ?? '');
    shown = undefined;
  });
}

/** Internal command behind the explanation's code-site links (not in the command palette). */
export const OPEN_LOCATION_COMMAND = 'shardproof.openLocation';

/** Open `uri` in the first editor column with the cursor on `line` (1-based), as the links promise. */
export async function openLocation(uri: string, line: number): Promise<void> {
  const position = new vscode.Position(Math.max(0, line - 1), 0);
  await vscode.window.showTextDocument(vscode.Uri.parse(uri), {
    viewColumn: vscode.ViewColumn.One,
    selection: new vscode.Range(position, position),
  });
}

/**
 * The server links code sites as `file:///path#L12`. A webview cannot follow file: links and
 * Markdown renderers drop them as unsafe, so each becomes a command link that opens the site.
 */
export function linkSourceLocations(markdown: string): string {
  return markdown.replace(/\]\((file:\/\/[^)#\s]+)(?:#L(\d+))?\)/g, (_whole, uri: string, line?: string) => {
    const args = encodeURIComponent(JSON.stringify([uri, line ? Number(line) : 1]));
    return `](command:${OPEN_LOCATION_COMMAND}?${args})`;
  });
}

/** Show an explanation (Markdown rendered by VS Code's Markdown engine, plus shardproof's SVG picture). */
export async function showExplanation(explanation: Explanation): Promise<void> {
  const html = await renderMarkdown(linkSourceLocations(explanation.markdown));
  if (!panel) {
    panel = vscode.window.createWebviewPanel(
      'shardproof.explanation',
      'shardproof: Explain Discrepancy',
      { viewColumn: vscode.ViewColumn.Beside, preserveFocus: true },
      { enableScripts: false, enableCommandUris: [OPEN_LOCATION_COMMAND], localResourceRoots: [] },
    );
    panel.onDidDispose(() => {
      panel = undefined;
      shown = undefined;
      watcher?.dispose();
      watcher = undefined;
    });
  }
  panel.title = `shardproof: ${explanation.kind}`;
  panel.webview.html = page(html, explanation.svg ?? '');
  panel.reveal(vscode.ViewColumn.Beside, true);
  shown = { explanation, html };
  watchResolution();
}

async function renderMarkdown(markdown: string): Promise<string> {
  try {
    const rendered = await vscode.commands.executeCommand<string>('markdown.api.render', markdown);
    if (typeof rendered === 'string' && rendered.length > 0) {
      return rendered;
    }
  } catch {
    // the built-in Markdown extension is disabled: fall back to a small renderer
  }
  return fallbackMarkdown(markdown);
}

function escapeHtml(text: string): string {
  return text.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
}

function inline(text: string): string {
  return escapeHtml(text)
    .replace(/`([^`]+)`/g, '<code>$1</code>')
    .replace(/\*\*([^*]+)\*\*/g, '<strong>$1</strong>')
    .replace(/\*([^*]+)\*/g, '<em>$1</em>')
    .replace(/\[([^\]]+)\]\(([^)]+)\)/g, '<a href="$2">$1</a>');
}

export function fallbackMarkdown(markdown: string): string {
  const out: string[] = [];
  let inList = false;
  for (const line of markdown.split('\n')) {
    const heading = /^(#{1,6})\s+(.*)$/.exec(line);
    const item = /^-\s+(.*)$/.exec(line);
    if (inList && !item) {
      out.push('</ul>');
      inList = false;
    }
    if (heading) {
      out.push(`<h${heading[1].length}>${inline(heading[2])}</h${heading[1].length}>`);
    } else if (item) {
      if (!inList) {
        out.push('<ul>');
        inList = true;
      }
      out.push(`<li>${inline(item[1])}</li>`);
    } else if (line.trim()) {
      out.push(`<p>${inline(line)}</p>`);
    }
  }
  if (inList) {
    out.push('</ul>');
  }
  return out.join('\n');
}

function page(body: string, svg: string): string {
  // No scripts; the SVG comes from shardproof's own renderer and is inlined as markup.
  return `<!DOCTYPE html>
<html lang="en"><head><meta charset="UTF-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; img-src data:;">
<style>
  body { font-family: var(--vscode-font-family); font-size: var(--vscode-font-size); color: var(--vscode-foreground);
         padding: 0 1.5em 1.5em 1.5em; line-height: 1.5; }
  code { font-family: var(--vscode-editor-font-family); background: var(--vscode-textCodeBlock-background);
         padding: 0 0.25em; border-radius: 3px; }
  a { color: var(--vscode-textLink-foreground); }
  .resolved { padding: 0.5em; border-left: 3px solid var(--vscode-editorWarning-foreground); }
  .picture { margin: 1em 0; padding: 0.5em; border: 1px solid var(--vscode-panel-border); border-radius: 4px;
             background: var(--vscode-editor-background); overflow-x: auto; }
</style></head>
<body class="shardproof-explanation">
${body}
${svg ? `<div class="picture" aria-label="neighbourhood of the discrepancy">${svg}</div>` : ''}
</body></html>`;
}
