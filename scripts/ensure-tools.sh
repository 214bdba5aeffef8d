#!/usr/bin/env bash
# Make sure the non-Python programs the tests need are present. As root on a
# Debian machine they are installed with apt; otherwise a missing one is an
# error (tests that need a real component never skip silently).
set -euo pipefail
need_apt=()
command -v prometheus >/dev/null 2>&1 || need_apt+=(prometheus)
command -v promtool   >/dev/null 2>&1 || need_apt+=(prometheus)
# The end-to-end tests: etcd, and the toolchain that builds kube-apiserver (scripts/build-kube-apiserver.sh).
command -v etcd        >/dev/null 2>&1 || need_apt+=(etcd-server)
command -v go          >/dev/null 2>&1 || need_apt+=(golang-go)
command -v dpkg-source >/dev/null 2>&1 || need_apt+=(dpkg-dev)
command -v openssl     >/dev/null 2>&1 || need_apt+=(openssl)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing ${need_apt[*]} with apt-get" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  else
    echo "error: missing ${need_apt[*]}: install these Debian packages ('prometheus' brings promtool;" \
      "etcd-server, golang-go, dpkg-dev and openssl are for the real API server of tests/e2e)" >&2
    exit 1
  fi
fi
if ! command -v kubectl >/dev/null 2>&1; then
  echo "error: kubectl is missing: it renders the kustomize overlays in deploy/; install kubectl" >&2
  exit 1
fi
prometheus --version 2>&1 | head -1
