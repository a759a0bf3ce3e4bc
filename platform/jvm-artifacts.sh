#!/usr/bin/env bash
# The JVM artifacts the project uses, from Maven Central, pinned with their checksums in
# platform/jvm-artifacts.lock: every jar of a set (transitive ones included) as
# "SET GROUP:ARTIFACT:VERSION SHA256".
#
#   platform/jvm-artifacts.sh [SET...]   put each set's jars in .venv/share/stateful-runtime/jars/SET
#                                        (platform/bootstrap.sh runs it for every set), fetched from
#                                        Maven Central ($SRT_MAVEN_REPO) by their pinned names. Jars
#                                        already there with their pinned checksum are kept: no network
#                                        after the first run. A jar whose checksum differs from the
#                                        lock is refused, never used.
#   platform/jvm-artifacts.sh lock SET [--exclude GROUP:ARTIFACT]... [--provided DIR]
#                                  GROUP:ARTIFACT:VERSION...
#                                        re-pin SET: resolve these coordinates with their runtime
#                                        dependencies (less each --exclude, and less every jar whose
#                                        artifact DIR already holds at some version: PySpark's jars)
#                                        and write every jar's checksum into the lock (a
#                                        maintainer's step when a version moves; commit the lock).
#
# Sets: kafka = Apache Kafka's broker (KRaft), started by the tests' fixtures and by
# platform/kafka-broker.sh. s3 = Hadoop's S3A filesystem at PySpark's Hadoop version, for
# checkpoints on S3 (checkpoint.dir=s3://...; put on Spark's classpath by the runtime):
#   platform/jvm-artifacts.sh lock s3 --exclude software.amazon.awssdk:bundle \
#     --provided .venv/lib/python3.11/site-packages/pyspark/jars org.apache.hadoop:hadoop-aws:3.5.0 \
#     software.amazon.awssdk:s3:2.35.4 software.amazon.awssdk:sts:2.35.4 \
#     software.amazon.awssdk:s3-transfer-manager:2.35.4 software.amazon.awssdk:apache-client:2.35.4
set -euo pipefail
cd "$(dirname "$0")/.."
lock=platform/jvm-artifacts.lock
jars_root=$PWD/.venv/share/stateful-runtime/jars
# Maven's own plugin, pinned too; no colours or transfer progress in the bootstrap's output.
dep=org.apache.maven.plugins:maven-dependency-plugin:3.8.1
# Maven's output (Debian's prints colour codes even when quiet) is shown only when it fails.
run_mvn() {
  local log rc=0
  log=$(mktemp)
  mvn -q -B --no-transfer-progress "$@" >"$log" 2>&1 || rc=$?
  [ $rc -eq 0 ] || sed 's/\x1b\[[0-9;]*m//g' "$log" | tail -40 >&2
  rm -f "$log"
  return $rc
}

die() { echo "jvm-artifacts: $*" >&2; exit 1; }
# Where pinned jars are fetched from (a mirror of Maven Central's layout may stand in).
repo=${SRT_MAVEN_REPO:-https://repo1.maven.org/maven2}

# A pom whose dependencies are the given coordinates (with theirs: what "lock" pins), less
# the artifacts in $excludes.
excludes=()
pom() {
  echo '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
  echo '<groupId>srt.local</groupId><artifactId>jvm-artifacts</artifactId><version>0</version>'
  echo '<dependencies>'
  local c g a v
  for c in "$@"; do
    IFS=: read -r g a v <<<"$c"
    echo "<dependency><groupId>$g</groupId><artifactId>$a</artifactId><version>$v</version>"
    echo '<exclusions>'
    local x xg xa
    for x in "${excludes[@]}"; do
      IFS=: read -r xg xa <<<"$x"
      echo "<exclusion><groupId>$xg</groupId><artifactId>$xa</artifactId></exclusion>"
    done
    echo '</exclusions></dependency>'
  done
  echo '</dependencies></project>'
}

jar_name() { local g a v; IFS=: read -r g a v <<<"$1"; echo "$g.$a-$v.jar"; }

if [ "${1:-}" = lock ]; then
  [ $# -ge 3 ] || die "usage: platform/jvm-artifacts.sh lock SET GROUP:ARTIFACT:VERSION..."
  set_name=$2; shift 2
  provided=
  while [ $# -gt 0 ]; do
    case $1 in
      --exclude) excludes+=("$2"); shift 2 ;;
      --provided) provided=$2; shift 2 ;;
      *) break ;;
    esac
  done
  [ $# -gt 0 ] || die "lock $set_name: no coordinates given"
  command -v mvn >/dev/null || die "Maven (mvn) is not on PATH; e.g. apt-get install maven"
  work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
  pom "$@" >"$work/pom.xml"
  run_mvn -f "$work/pom.xml" "$dep:copy-dependencies" -Dmdep.prependGroupId=true \
    -DincludeScope=runtime -DoutputDirectory="$work/jars" \
    || die "Maven could not resolve $* (see above)"
  run_mvn -f "$work/pom.xml" "$dep:list" -DincludeScope=runtime \
    -DoutputFile="$work/list.txt" -DoutputAbsoluteArtifactFilename=false >/dev/null
  new=$(mktemp)
  grep -v "^$set_name " "$lock" 2>/dev/null >"$new" || true
  # "$dep:list" lines: "   group:artifact:jar:version:scope" (a classifier adds a field).
  grep -E '^ +[^ :]+:[^ :]+:jar:' "$work/list.txt" | awk '{print $1}' | while IFS=: read -r g a _ v _; do
    if [ -n "$provided" ] && compgen -G "$provided/$a-[0-9]*.jar" >/dev/null; then
      continue  # already on Spark's classpath (its version wins there anyway)
    fi
    sum=$(sha256sum "$work/jars/$g.$a-$v.jar" | cut -d' ' -f1)
    echo "$set_name $g:$a:$v $sum"
  done | sort >>"$new"
  { echo "# SET GROUP:ARTIFACT:VERSION SHA256 (written by platform/jvm-artifacts.sh lock; do not edit)"
    grep -v '^#' "$new" | sort; } >"$lock"
  rm -f "$new"
  echo "jvm-artifacts: pinned $(grep -c "^$set_name " "$lock") jars of set $set_name in $lock"
  exit 0
fi

[ -f "$lock" ] || die "$lock is missing"
sets=("$@")
[ ${#sets[@]} -gt 0 ] || mapfile -t sets < <(grep -v '^#' "$lock" | cut -d' ' -f1 | sort -u)
for set_name in "${sets[@]}"; do
  dir="$jars_root/$set_name"
  mapfile -t entries < <(grep "^$set_name " "$lock" | cut -d' ' -f2-)
  [ ${#entries[@]} -gt 0 ] || die "no set '$set_name' in $lock"
  missing=()
  for e in "${entries[@]}"; do
    coord=${e% *} sum=${e#* }
    f="$dir/$(jar_name "$coord")"
    [ -f "$f" ] && [ "$(sha256sum "$f" | cut -d' ' -f1)" = "$sum" ] && continue
    rm -f "$f"
    missing+=("$coord")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    # Each pinned jar straight from the repository, in parallel (no Maven, no resolution: the
    # lock already lists every jar of the set), each checked against its pinned checksum.
    echo "jvm-artifacts: fetching ${#missing[@]} jars of set $set_name from $repo"
    mkdir -p "$dir"
    for coord in "${missing[@]}"; do
      IFS=: read -r g a v <<<"$coord"
      echo "$repo/${g//.//}/$a/$v/$a-$v.jar $dir/$(jar_name "$coord")"
    done | xargs -P 8 -n 2 sh -c 'curl -fsSL --retry 3 -o "$2.part" "$1" && mv "$2.part" "$2"' _ \
      || die "could not fetch the jars of set $set_name from $repo (see above); check the" \
        "network, or set SRT_MAVEN_REPO to a Maven Central mirror"
    for e in "${entries[@]}"; do
      coord=${e% *} sum=${e#* }
      f="$dir/$(jar_name "$coord")"
      got=$(sha256sum "$f" | cut -d' ' -f1)
      if [ "$got" != "$sum" ]; then
        rm -f "$f"
        die "$coord: checksum $got is not the pinned $sum; the jar was removed. If the" \
          "repository serves it so, re-pin with 'platform/jvm-artifacts.sh lock'"
      fi
    done
  fi
  # Only the pinned jars are on the set's classpath (a re-pin leaves no older version behind).
  for f in "$dir"/*.jar; do
    keep=no
    for e in "${entries[@]}"; do [ "$f" = "$dir/$(jar_name "${e% *}")" ] && keep=yes; done
    [ $keep = yes ] || rm -f "$f"
  done
done
