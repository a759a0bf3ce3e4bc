#!/usr/bin/env bash
# Install the Debian packages whose programs the test suite starts as plain processes on
# 127.0.0.1 (nothing here starts a service):
#   chromium           /usr/bin/chromium             the Dagster UI test (headless)
#   clickhouse-server  clickhouse-server on PATH     the ClickHouse sink tests (18.16)
#   postgresql         /usr/lib/postgresql/*/bin     the PostgreSQL sink tests (initdb, pg_ctl:
#                                                    Debian keeps them off PATH)
#
#   platform/install-services.sh [PACKAGE...]      (default: all three; bootstrap.sh dev runs it)
#
# Quick and silent when each program is already there; runs `apt-get update` only when the
# package lists know no candidate for a missing package (or the install fails on stale lists).
# Exits non-zero naming what could not be installed.
set -euo pipefail

present() {
  case "$1" in
    chromium) [ -x /usr/bin/chromium ] ;;
    clickhouse-server) command -v clickhouse-server >/dev/null ;;
    postgresql) command -v initdb >/dev/null || compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null ;;
    *) echo "install-services: unknown package '$1' (chromium, clickhouse-server, postgresql)" >&2
       exit 2 ;;
  esac
}

packages=("$@")
[ ${#packages[@]} -gt 0 ] || packages=(chromium clickhouse-server postgresql)
missing=()
for p in "${packages[@]}"; do present "$p" || missing+=("$p"); done
[ ${#missing[@]} -eq 0 ] && exit 0

if ! command -v apt-get >/dev/null; then
  echo "install-services: ${missing[*]} missing and apt-get is unavailable; install them with" \
    "the system's package manager" >&2
  exit 1
fi
sudo=()
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null; then
    echo "install-services: installing ${missing[*]} needs root and there is no sudo; run as" \
      "root: apt-get install -y --no-install-recommends ${missing[*]}" >&2
    exit 1
  fi
  sudo=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
# Another apt-get may hold the dpkg lock (a shared machine): wait for it instead of failing.
apt=("${sudo[@]}" apt-get -q -y -o DPkg::Lock::Timeout=300)
for p in "${missing[@]}"; do
  if ! apt-cache policy "$p" 2>/dev/null | grep -q 'Candidate: [0-9]'; then
    echo "install-services: apt-get update (the package lists have no $p)"
    "${apt[@]}" update >/dev/null
    break
  fi
done
echo "install-services: apt-get install ${missing[*]}"
if ! "${apt[@]}" install --no-install-recommends "${missing[@]}" >/dev/null; then
  echo "install-services: install failed; retrying after apt-get update"
  "${apt[@]}" update >/dev/null
  "${apt[@]}" install --no-install-recommends "${missing[@]}" >/dev/null
fi
failed=()
for p in "${missing[@]}"; do present "$p" || failed+=("$p"); done
if [ ${#failed[@]} -gt 0 ]; then
  echo "install-services: installed, but the programs of ${failed[*]} are not where the tests look" >&2
  exit 1
fi
