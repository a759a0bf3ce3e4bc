#!/usr/bin/env bash
# Build the runtime's JVM classes (platform/jvm/*.java) against the venv's Spark into
# .venv/share/stateful-runtime/srt-jvm.jar, which a local master's driver puts on its class path
# (stateful_runtime/runtime/session.py). platform/bootstrap.sh runs it when the venv has none;
# without a JDK's javac the job runs on Hadoop's own classes.
set -euo pipefail
cd "$(dirname "$0")/.."
jars=$(.venv/bin/python -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')
out=.venv/share/stateful-runtime/srt-jvm.jar
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
javac --release 17 -nowarn -cp "$jars/*" -d "$tmp/classes" platform/jvm/*.java
mkdir -p "$(dirname "$out")"
jar --create --file "$tmp/srt-jvm.jar" -C "$tmp/classes" .
mv "$tmp/srt-jvm.jar" "$out"
echo "jvm classes: $out"
