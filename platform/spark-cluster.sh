#!/usr/bin/env bash
# A one-machine Spark standalone cluster (one master, one worker) from the venv's pyspark wheel.
#
#   platform/spark-cluster.sh start  [DIR]   # prints the master URL, e.g. spark://127.0.0.1:7077
#   platform/spark-cluster.sh status [DIR]   # exit 0 if master and worker are up, 3 if not
#   platform/spark-cluster.sh stop   [DIR]
#
# DIR (default $SRT_CLUSTER_DIR, else ./srt-data/spark-cluster) holds the pid files, logs, the
# worker's work dir and cluster.env (MASTER_URL, MASTER_WEBUI_URL, ...; shell syntax).
#
# Environment (all optional):
#   SRT_PYTHON               python with pyspark (default: <repo>/.venv/bin/python, else python3)
#   SRT_MASTER_PORT          master RPC port        (default: a free port)
#   SRT_MASTER_WEBUI_PORT    master web UI port     (default: a free port)
#   SRT_WORKER_PORT          worker RPC port        (default: a free port)
#   SRT_WORKER_WEBUI_PORT    worker web UI port     (default: a free port)
#   SRT_WORKER_CORES         cores the worker offers  (default 2)
#   SRT_WORKER_MEMORY        memory the worker offers (default 2g)
#   SRT_DAEMON_MEMORY        heap of the master and worker JVMs themselves (default 512m)
#   SRT_CLUSTER_TIMEOUT      seconds to wait for start-up (default 90)
#   SRT_CLUSTER_STOP_TIMEOUT seconds a daemon has to exit on SIGTERM before SIGKILL (default 30)
#
# Everything binds to 127.0.0.1. Ports are used exactly (spark.port.maxRetries=0): a taken port
# fails the start with the daemon's log instead of silently moving to the next port.

set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"

usage() {
    sed -n '2,23p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

log() { echo "spark-cluster: $*" >&2; }
die() { log "error: $*"; exit 1; }

CMD="${1:-}"
[[ -n "$CMD" ]] || usage
shift
DIR="${1:-${SRT_CLUSTER_DIR:-$PWD/srt-data/spark-cluster}}"
DIR="$(realpath -m "$DIR")"
TIMEOUT="${SRT_CLUSTER_TIMEOUT:-90}"
# A worker that does not exit on SIGTERM is waiting on its executors' shutdown; nothing it
# holds outlives SIGKILL (its executors are killed with it, below).
STOP_TIMEOUT="${SRT_CLUSTER_STOP_TIMEOUT:-30}"

find_python() {
    if [[ -n "${SRT_PYTHON:-}" ]]; then
        echo "$SRT_PYTHON"
    elif [[ -x "$ROOT/.venv/bin/python" ]]; then
        echo "$ROOT/.venv/bin/python"
    elif command -v python3 >/dev/null; then
        command -v python3
    else
        die "no python found; set SRT_PYTHON to the venv's python"
    fi
}
PYTHON="$(find_python)"

declare -A CLASS=(
    [master]=org.apache.spark.deploy.master.Master
    [worker]=org.apache.spark.deploy.worker.Worker
)

pid_of() {  # pid_of master|worker -> the pid if that daemon is alive, else nothing
    local file="$DIR/$1.pid" pid
    [[ -f "$file" ]] || return 0
    pid="$(<"$file")"
    [[ "$pid" =~ ^[0-9]+$ ]] || return 0
    # Alive, not a zombie, and still our JVM (not an unrelated process that reused the pid).
    # -ww: the whole command line, whatever COLUMNS says (pytest-xdist's workers set it, and
    # the class name comes after a long classpath).
    if [[ "$(ps -o stat= -p "$pid" 2>/dev/null)" =~ ^[^Z] ]] \
        && ps -ww -o args= -p "$pid" 2>/dev/null | grep -qF -- "${CLASS[$1]}"; then
        echo "$pid"
    fi
}

master_json() {  # the master's /json/ document, or nothing if it does not answer
    # shellcheck disable=SC1091
    [[ -f "$DIR/cluster.env" ]] || return 0
    (source "$DIR/cluster.env" && curl -fs --max-time 2 "$MASTER_WEBUI_URL/json/") || true
}

master_up() {  # the master's web UI answers /json/
    [[ -n "$(master_json)" ]]
}

worker_alive() {  # worker_alive PORT: the master lists a worker on 127.0.0.1:PORT as ALIVE
    master_json | "$PYTHON" -c '
import json, sys
try:
    doc = json.load(sys.stdin)
except ValueError:
    sys.exit(1)
port = int(sys.argv[1])
ok = any(w.get("host") == "127.0.0.1" and w.get("port") == port and w.get("state") == "ALIVE"
         for w in doc.get("workers", []))
sys.exit(0 if ok and doc.get("aliveworkers", 0) >= 1 else 1)
' "$1"
}

tail_log() { log "last lines of $1:"; tail -n 30 "$1" >&2 || true; }

free_ports() {  # free_ports N -> N distinct free TCP ports on 127.0.0.1, one per line
    "$PYTHON" - "$1" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print("\n".join(str(s.getsockname()[1]) for s in socks))
for s in socks:
    s.close()
EOF
}

launch() {  # launch NAME CLASS ARGS... : start a daemon detached, stdout/stderr to NAME.log
    local name="$1"
    shift
    # setsid: its own session, so the caller's Ctrl-C or a closed terminal does not reach it;
    # stdin/stdout/stderr detached, so a caller capturing our stdout does not wait for it.
    # spark-class execs java, so $! is the JVM's pid. env --default-signal=TERM: a caller that
    # ignores SIGTERM (one started in the background with SIGINT ignored that some library
    # then mapped SIGTERM onto, as Dagster's interrupt handling does) would pass that on, and
    # HotSpot leaves an ignored SIGTERM ignored: `stop` then waited out its timeout.
    setsid env --default-signal=TERM "$SPARK_HOME/bin/spark-class" "$@" </dev/null >"$DIR/$name.log" 2>&1 &
    echo $! >"$DIR/$name.pid"
}

wait_until() {  # wait_until DEADLINE DESCRIPTION CHECK... ; fails if a daemon dies meanwhile
    local deadline="$1" what="$2"
    shift 2
    until "$@"; do
        for d in master worker; do
            if [[ -f "$DIR/$d.pid" && -z "$(pid_of "$d")" ]]; then
                tail_log "$DIR/$d.log"
                stop_all >/dev/null 2>&1 || true
                die "the $d exited while waiting for $what"
            fi
        done
        if (( SECONDS >= deadline )); then
            tail_log "$DIR/master.log"
            tail_log "$DIR/worker.log"
            stop_all >/dev/null 2>&1 || true
            die "timed out after ${TIMEOUT}s waiting for $what"
        fi
        sleep 0.2  # poll interval of the condition above
    done
}

cmd_start() {
    if [[ -n "$(pid_of master)" && -n "$(pid_of worker)" ]]; then
        # shellcheck disable=SC1091
        source "$DIR/cluster.env"
        log "already running (master pid $(pid_of master), worker pid $(pid_of worker))"
        echo "$MASTER_URL"
        return 0
    fi
    stop_all >/dev/null 2>&1 || true  # half a cluster from an earlier start

    command -v java >/dev/null || [[ -n "${JAVA_HOME:-}" ]] || die "java not found (need 17+)"
    SPARK_HOME="$("$PYTHON" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')" \
        || die "$PYTHON cannot import pyspark"
    [[ -x "$SPARK_HOME/bin/spark-class" ]] || die "no bin/spark-class in $SPARK_HOME"
    export SPARK_HOME
    export SPARK_LOCAL_IP=127.0.0.1 SPARK_LOCAL_HOSTNAME=127.0.0.1
    export SPARK_MASTER_HOST=127.0.0.1
    export PYSPARK_PYTHON="$PYTHON" PYSPARK_DRIVER_PYTHON="$PYTHON"
    # An empty conf dir: no spark-env.sh or spark-defaults.conf from elsewhere leaks in.
    export SPARK_CONF_DIR="$DIR/conf"
    mkdir -p "$DIR" "$SPARK_CONF_DIR" "$DIR/work"
    export SPARK_DAEMON_MEMORY="${SRT_DAEMON_MEMORY:-512m}"
    # No REST submission server: it would take the fixed port 6066.
    export SPARK_MASTER_OPTS="${SPARK_MASTER_OPTS:-} -Dspark.port.maxRetries=0 -Dspark.master.rest.enabled=false"
    export SPARK_WORKER_OPTS="${SPARK_WORKER_OPTS:-} -Dspark.port.maxRetries=0"

    local ports mp mw wp ww
    mapfile -t ports < <(free_ports 4)
    mp="${SRT_MASTER_PORT:-${ports[0]}}"
    mw="${SRT_MASTER_WEBUI_PORT:-${ports[1]}}"
    wp="${SRT_WORKER_PORT:-${ports[2]}}"
    ww="${SRT_WORKER_WEBUI_PORT:-${ports[3]}}"
    local cores="${SRT_WORKER_CORES:-2}" memory="${SRT_WORKER_MEMORY:-2g}"

    cat >"$DIR/cluster.env" <<EOF
MASTER_URL=spark://127.0.0.1:$mp
MASTER_WEBUI_URL=http://127.0.0.1:$mw
WORKER_PORT=$wp
WORKER_WEBUI_URL=http://127.0.0.1:$ww
WORKER_CORES=$cores
WORKER_MEMORY=$memory
WORKER_DIR=$DIR/work
SPARK_HOME=$SPARK_HOME
PYSPARK_PYTHON=$PYTHON
EOF
    # shellcheck disable=SC1091
    source "$DIR/cluster.env"

    local deadline=$((SECONDS + TIMEOUT))
    # Both JVMs start at once (each takes ~5-10 s to boot on 2 cores); the worker connects to
    # the master only after its own boot, by which time the master's RPC port is normally up.
    launch master "${CLASS[master]}" \
        --host 127.0.0.1 --port "$mp" --webui-port "$mw"
    launch worker "${CLASS[worker]}" \
        --host 127.0.0.1 --port "$wp" --webui-port "$ww" \
        --cores "$cores" --memory "$memory" --work-dir "$DIR/work" "$MASTER_URL"
    wait_until "$deadline" "the master's web UI on port $mw" master_up
    wait_until "$deadline" "the worker to register with the master" worker_alive "$wp"
    log "master pid $(pid_of master) at $MASTER_URL (UI $MASTER_WEBUI_URL), worker pid" \
        "$(pid_of worker) with $cores cores and $memory; files in $DIR"
    echo "$MASTER_URL"
}

children_of() { ps -o pid= --ppid "$1" 2>/dev/null | tr -d ' ' || true; }

stop_one() {  # stop_one NAME: SIGTERM, wait for exit, SIGKILL after the timeout
    local name="$1" pid
    pid="$(pid_of "$name")"
    if [[ -z "$pid" ]]; then
        rm -f "$DIR/$name.pid"
        return 0
    fi
    # The worker's executors are its child processes; remember them in case they outlive it.
    local kids
    kids="$(children_of "$pid")"
    kill -TERM "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + STOP_TIMEOUT))
    while kill -0 "$pid" 2>/dev/null && (( SECONDS < deadline )); do
        sleep 0.1  # poll for the process to exit
    done
    if kill -0 "$pid" 2>/dev/null; then
        # A thread dump into the daemon's log (SIGQUIT) says what it waited on.
        log "$name (pid $pid) did not exit in ${STOP_TIMEOUT}s; its threads are in $DIR/$name.log; killing it"
        kill -QUIT "$pid" 2>/dev/null || true
        for _ in $(seq 20); do  # up to 2 s for the dump to reach the log
            grep -q "^Full thread dump" "$DIR/$name.log" 2>/dev/null && break
            sleep 0.1
        done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    for kid in $kids; do
        if kill -0 "$kid" 2>/dev/null; then
            log "killing leftover child $kid of the $name"
            kill -KILL "$kid" 2>/dev/null || true
        fi
    done
    rm -f "$DIR/$name.pid"
    log "$name (pid $pid) stopped"
}

stop_all() {
    stop_one worker
    stop_one master
}

STATUS_PY='
import json, sys
try:
    d = json.load(sys.stdin)
except ValueError:
    print("master UI: not answering")
    sys.exit(0)
g = d.get
print("url:", g("url"), " status:", g("status"), " alive workers:", g("aliveworkers"),
      " cores used:", "%s/%s" % (g("coresused"), g("cores")),
      " memory used MB:", "%s/%s" % (g("memoryused"), g("memory")))
for kind in ("activeapps", "completedapps"):
    for a in g(kind, []):
        print(kind[:-4], "app:", a.get("id"), a.get("name"), a.get("state"))
'

cmd_status() {
    local m w rc=0
    m="$(pid_of master)"
    w="$(pid_of worker)"
    if [[ -n "$m" ]]; then echo "master: running, pid $m"; else echo "master: stopped"; fi
    if [[ -n "$w" ]]; then echo "worker: running, pid $w"; else echo "worker: stopped"; fi
    [[ -n "$m" && -n "$w" ]] || rc=3
    if [[ -n "$m" ]]; then
        master_json | "$PYTHON" -c "$STATUS_PY"
    fi
    return $rc
}

case "$CMD" in
    start) cmd_start ;;
    stop) stop_all ;;
    status) cmd_status ;;
    -h|--help|help) usage ;;
    *) usage ;;
esac
