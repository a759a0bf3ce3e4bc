#!/usr/bin/env bash
# Install Debian's chromium (/usr/bin/chromium) if it is missing: the Dagster UI test
# (tests/dagster_defs/test_ui.py) loads `dagster dev` in headless Chromium.
# Quick and silent when chromium is already installed; runs `apt-get update` only when the
# package lists know no chromium to install (or the install fails on stale lists).
set -euo pipefail
[ -x /usr/bin/chromium ] && exit 0
if ! command -v apt-get >/dev/null; then
  echo "install-chromium: /usr/bin/chromium is missing and apt-get is unavailable;" \
    "install Chromium (Debian package 'chromium') to run the Dagster UI test" >&2
  exit 1
fi
sudo=()
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null; then
    echo "install-chromium: installing chromium needs root and there is no sudo;" \
      "run as root: apt-get install -y --no-install-recommends chromium" >&2
    exit 1
  fi
  sudo=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
# Another apt-get may hold the dpkg lock (a shared machine): wait for it instead of failing.
apt=("${sudo[@]}" apt-get -q -y -o DPkg::Lock::Timeout=300)
if ! apt-cache policy chromium 2>/dev/null | grep -q 'Candidate: [0-9]'; then
  echo "install-chromium: apt-get update (the package lists have no chromium)"
  "${apt[@]}" update >/dev/null
fi
echo "install-chromium: apt-get install chromium"
if ! "${apt[@]}" install --no-install-recommends chromium >/dev/null; then
  echo "install-chromium: install failed; retrying after apt-get update"
  "${apt[@]}" update >/dev/null
  "${apt[@]}" install --no-install-recommends chromium >/dev/null
fi
[ -x /usr/bin/chromium ] || { echo "install-chromium: chromium installed but /usr/bin/chromium is missing" >&2; exit 1; }
