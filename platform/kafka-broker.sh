#!/usr/bin/env bash
# Apache Kafka on 127.0.0.1, in the foreground: one node in KRaft mode (broker and controller),
# from the pinned jars of platform/jvm-artifacts.sh (set kafka; platform/bootstrap.sh dev).
#
#   platform/kafka-broker.sh [PORT] [DATA_DIR]     # default 9092, ./srt-data/kafka
#
# Then: srt run examples/upi_per_minute.py --set source.kind=kafka \
#         --set source.bootstrap_servers=127.0.0.1:PORT --set sink.kind=kafka
#
# The first start writes DATA_DIR/server.properties (the controller on a free port) and
# formats DATA_DIR/logs; a later start with the same DATA_DIR is a restart of the same broker
# (its port, its records, its transactions), whatever PORT says. SIGTERM stops it cleanly;
# SIGKILL is a crash it recovers from at the next start. The tests' fixtures start it so
# (tests/connectors/kafka/helpers.py).
#
# Environment (all optional):
#   SRT_KAFKA_HEAP             the broker's heap (default 512m)
#   SRT_KAFKA_NODE_ID          this node's id (default 1)
#   SRT_KAFKA_CONTROLLER_PORT  its controller listener (default a free port)
#   SRT_KAFKA_VOTERS           the controller quorum, id@host:port,... (default this node alone)
#   SRT_KAFKA_CLUSTER_ID       the cluster id every node is formatted with (default a new one)
#   SRT_KAFKA_REPLICAS         replicas of the internal topics and of new topics (default 1;
#                              more: min.insync.replicas 2), for a cluster of that many nodes
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PORT="${1:-9092}"
DATA="$(realpath -m "${2:-$ROOT/srt-data/kafka}")"
JARS="$ROOT/.venv/share/stateful-runtime/jars/kafka"
die() { echo "kafka-broker: $*" >&2; exit 1; }
command -v java >/dev/null || die "java is not on PATH (Java 17 runs the broker)"
compgen -G "$JARS/org.apache.kafka.kafka_2.13-*.jar" >/dev/null \
  || die "no Kafka jars in $JARS: run platform/bootstrap.sh dev (or platform/jvm-artifacts.sh kafka)"

props="$DATA/server.properties"
# C1 only and the serial collector: a test broker starts in seconds on a loaded 2-core machine.
java=(java "-Xms128m" "-Xmx${SRT_KAFKA_HEAP:-512m}" -XX:+UseSerialGC -XX:TieredStopAtLevel=1
  "-Dlog4j2.configurationFile=$DATA/log4j2.properties" -cp "$JARS/*")
if [ ! -f "$props" ]; then
  mkdir -p "$DATA"
  node="${SRT_KAFKA_NODE_ID:-1}"
  controller="${SRT_KAFKA_CONTROLLER_PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}"
  voters="${SRT_KAFKA_VOTERS:-$node@127.0.0.1:$controller}"
  replicas="${SRT_KAFKA_REPLICAS:-1}"
  isr=$(( replicas > 1 ? 2 : 1 ))
  cat >"$props.tmp" <<EOF
process.roles=broker,controller
node.id=$node
controller.quorum.voters=$voters
listeners=PLAINTEXT://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$controller
advertised.listeners=PLAINTEXT://127.0.0.1:$PORT
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$DATA/logs
num.partitions=1
# The internal topics have as many replicas as the cluster has nodes, and few partitions
# (created at the first consumer group and the first transaction).
default.replication.factor=$replicas
min.insync.replicas=$isr
offsets.topic.replication.factor=$replicas
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=$replicas
transaction.state.log.min.isr=$isr
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=$replicas
share.coordinator.state.topic.min.isr=$isr
group.initial.rebalance.delay.ms=0
EOF
  cat >"$DATA/log4j2.properties" <<EOF
status = error
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.out.ref = out
logger.server.name = kafka.server.KafkaRaftServer
logger.server.level = INFO
EOF
  # (--cluster-id=ID: an id may start with '-', which the parser takes for an option if apart)
  cluster="${SRT_KAFKA_CLUSTER_ID:-$(python3 -c 'import base64, uuid; print(base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("="))')}"
  "${java[@]}" kafka.tools.StorageTool format --ignore-formatted --cluster-id="$cluster" -c "$props.tmp" >/dev/null \
    || die "formatting $DATA/logs failed (see above)"
  mv "$props.tmp" "$props"
fi
# SIGTERM is a clean shutdown even when the caller ignores it (HotSpot keeps an inherited
# ignored SIGTERM ignored; see platform/spark-cluster.sh's launch).
exec env --default-signal=TERM "${java[@]}" kafka.Kafka "$props"
