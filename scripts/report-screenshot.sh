#!/usr/bin/env bash
# A screenshot of a backtest report's first screens (headline, frontier, cost per day, hardest days),
# taken with headless Chromium: docs/report-screenshot.png is `make demo`'s report through this.
#   usage: scripts/report-screenshot.sh REPORT.html OUT.png [WIDTHxHEIGHT]
# Needs Chromium (Debian: apt-get install chromium). No test needs it.
set -euo pipefail

report=${1:?usage: $0 REPORT.html OUT.png [WIDTHxHEIGHT]}
out=${2:?usage: $0 REPORT.html OUT.png [WIDTHxHEIGHT]}
size=${3:-1280x2400}

browser=""
for candidate in chromium chromium-browser google-chrome; do
    if command -v "$candidate" >/dev/null 2>&1; then browser=$candidate; break; fi
done
if [ -z "$browser" ]; then
    echo "report-screenshot: no Chromium on PATH; install it (Debian: apt-get install chromium) and run again" >&2
    exit 1
fi
if [ ! -f "$report" ]; then
    echo "report-screenshot: $report does not exist; run make demo first" >&2
    exit 1
fi

# Chromium refuses to run as root inside its sandbox; a throwaway profile keeps the user's untouched.
sandbox=()
if [ "$(id -u)" = 0 ]; then sandbox=(--no-sandbox); fi
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT

mkdir -p "$(dirname "$out")"
"$browser" --headless "${sandbox[@]}" --disable-gpu --hide-scrollbars --force-device-scale-factor=1 \
    --user-data-dir="$profile" --window-size="${size/x/,}" --screenshot="$profile/shot.png" \
    "file://$(realpath "$report")" 2>/dev/null
mv "$profile/shot.png" "$out"
echo "report-screenshot: $out ($size) from $report"
