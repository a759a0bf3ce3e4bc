#!/usr/bin/env bash
# Install Debian's clickhouse-server (18.16: /usr/bin/clickhouse-server) if it is missing: the
# ClickHouse sink tests (tests/dbt_sink/) start it as a plain process on 127.0.0.1 (nothing
# here starts a service). Quick and silent when it is already installed; runs `apt-get update`
# only when the package lists know no clickhouse-server (or the install fails on stale lists).
set -euo pipefail
command -v clickhouse-server >/dev/null && exit 0
if ! command -v apt-get >/dev/null; then
  echo "install-clickhouse: clickhouse-server is missing and apt-get is unavailable;" \
    "install ClickHouse to run the ClickHouse sink tests" >&2
  exit 1
fi
sudo=()
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null; then
    echo "install-clickhouse: installing clickhouse-server needs root and there is no sudo;" \
      "run as root: apt-get install -y --no-install-recommends clickhouse-server" >&2
    exit 1
  fi
  sudo=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
# Another apt-get may hold the dpkg lock (a shared machine): wait for it instead of failing.
apt=("${sudo[@]}" apt-get -q -y -o DPkg::Lock::Timeout=300)
if ! apt-cache policy clickhouse-server 2>/dev/null | grep -q 'Candidate: [0-9]'; then
  echo "install-clickhouse: apt-get update (the package lists have no clickhouse-server)"
  "${apt[@]}" update >/dev/null
fi
echo "install-clickhouse: apt-get install clickhouse-server"
if ! "${apt[@]}" install --no-install-recommends clickhouse-server >/dev/null; then
  echo "install-clickhouse: install failed; retrying after apt-get update"
  "${apt[@]}" update >/dev/null
  "${apt[@]}" install --no-install-recommends clickhouse-server >/dev/null
fi
command -v clickhouse-server >/dev/null \
  || { echo "install-clickhouse: installed but clickhouse-server is not on PATH" >&2; exit 1; }
