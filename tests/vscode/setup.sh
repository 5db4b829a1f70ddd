#!/usr/bin/env bash
# Install what the real-VS-Code end-to-end test needs, offline-safe (see the README, "Quick start"):
# the Debian packages chromium, ripgrep (seeds code-server's ripgrep instead of a download),
# libkrb5-dev (headers a code-server dependency builds against) and build-essential, through
# apt-get as root or with sudo (only the missing ones); then code-server 4.100.3 (the newest for
# node 20) and playwright-core into tests/vscode/.tools. Idempotent: does nothing when everything
# is already there.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
TOOLS="$HERE/.tools"

missing_packages=()
command -v chromium >/dev/null 2>&1 || missing_packages+=(chromium)
command -v rg >/dev/null 2>&1 || missing_packages+=(ripgrep)
[ -f /usr/include/gssapi/gssapi.h ] || missing_packages+=(libkrb5-dev)
command -v g++ >/dev/null 2>&1 || missing_packages+=(build-essential)
if [ ${#missing_packages[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing_packages[@]}" >/dev/null
fi

if [ -x "$TOOLS/node_modules/.bin/code-server" ] && [ -d "$TOOLS/node_modules/playwright-core" ]; then
  exit 0
fi
mkdir -p "$TOOLS/tmp" "$TOOLS/rgseed"
# @vscode/ripgrep's postinstall downloads ripgrep from GitHub unless it finds it in its cache.
export TMPDIR="$TOOLS/tmp"
RGC="$TMPDIR/vscode-ripgrep-cache-1.15.11"
mkdir -p "$RGC"
cp "$(command -v rg)" "$TOOLS/rgseed/rg"
tar czf "$RGC/ripgrep-v13.0.0-10-x86_64-unknown-linux-musl.tar.gz" -C "$TOOLS/rgseed" rg
cd "$TOOLS"
[ -f package.json ] || echo '{"name":"shardproof-e2e-tools","version":"1.0.0","private":true}' > package.json
npm_config_yes=true npm install --no-audit --no-fund --unsafe-perm --loglevel=error \
  code-server@4.100.3 playwright-core@1.65.1 >/dev/null
