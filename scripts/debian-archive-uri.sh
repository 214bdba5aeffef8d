#!/usr/bin/env bash
# Prints the Debian archive URI this machine's apt is already set up with (the first
# `URIs:` of a deb822 source, else the first `deb` line of sources.list), so the deb-src
# line for kube-apiserver's source package uses the same archive as everything else.
set -euo pipefail
uri=""
for f in /etc/apt/sources.list.d/*.sources; do
  [ -f "$f" ] || continue
  uri=$(awk '/^URIs:/ { print $2; exit }' "$f")
  [ -n "$uri" ] && break
done
if [ -z "$uri" ] && [ -f /etc/apt/sources.list ]; then
  uri=$(awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; exit } }' /etc/apt/sources.list)
fi
[ -n "$uri" ] || { echo "no Debian archive configured for apt (/etc/apt/sources.list[.d])" >&2; exit 1; }
echo "${uri%/}"
