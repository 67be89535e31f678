#!/usr/bin/env bash
# A three-node Apache Cassandra 5.0 cluster on loopback for the database
# fault tests and harness runs: nodes on 127.0.0.1, 127.0.0.2 and 127.0.0.3,
# each with its own run directory, the same CQL port on every address (the
# driver reaches the peers it discovers on the port of its contact point),
# 127.0.0.1 the seed. Each node is one scripts/cassandra.sh node.
#
#   scripts/cassandra-cluster.sh start          start the three nodes, wait until each answers CQL and sees the others
#   scripts/cassandra-cluster.sh stop           stop the nodes this script started
#   scripts/cassandra-cluster.sh wipe           stop them and delete their data: the next start is a new cluster
#   scripts/cassandra-cluster.sh status         each node's state
#   scripts/cassandra-cluster.sh nodes          print the contact points, comma-separated (FANOUT_TEST_CQL_CLUSTER)
#   scripts/cassandra-cluster.sh kill N         SIGKILL node N (1-3): a crash, no drain
#   scripts/cassandra-cluster.sh pause N        SIGSTOP node N: alive to TCP, answers nothing
#   scripts/cassandra-cluster.sh resume N       SIGCONT node N
#   scripts/cassandra-cluster.sh restart N      start node N again after a kill (waits for CQL)
#   scripts/cassandra-cluster.sh pid N          print node N's pid
#   scripts/cassandra-cluster.sh logs N [LINES] the tail of node N's log
#
# It coexists with the single nodes of scripts/cassandra.sh (127.0.0.1:9042
# and, for TLS, 127.0.0.1:9142): the cluster listens for CQL on port 9043 of
# each address and talks to itself on port 7200, so CI and developers can
# run both at once. FANOUT_CASSANDRA_CLUSTER_PORT=9042 puts the cluster on
# the standard port instead, once the single node is stopped.
#
# The keyspace's replication factor is the client's choice: the tests and the
# harness create theirs with {'class': 'SimpleStrategy', 'replication_factor': 3},
# so that every node holds every row and one node down leaves a quorum.
#
# Sized for a 2-core machine beside the single node: 768 MiB of heap per
# node (FANOUT_CASSANDRA_CLUSTER_HEAP), the small memtables and thread pools
# of scripts/cassandra.sh. The nodes join without bootstrap streaming (a new
# cluster has nothing to stream), so they start side by side once the seed
# answers: about a minute on this machine, cold.
#
# Environment: FANOUT_CASSANDRA_HOME, FANOUT_CASSANDRA_VERSION,
# FANOUT_CASSANDRA_JAVA, FANOUT_CASSANDRA_WAIT as for scripts/cassandra.sh;
# FANOUT_CASSANDRA_CLUSTER_PORT (9043), FANOUT_CASSANDRA_CLUSTER_HEAP (768M).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="${FANOUT_CASSANDRA_HOME:-$HOME/.cache/fanout-cassandra}"
PORT="${FANOUT_CASSANDRA_CLUSTER_PORT:-9043}"
STORAGE_PORT=7200
HEAP="${FANOUT_CASSANDRA_CLUSTER_HEAP:-768M}"
NODES=(127.0.0.1 127.0.0.2 127.0.0.3)
SEED="${NODES[0]}"
WAIT_SECONDS="${FANOUT_CASSANDRA_WAIT:-240}"

log() { echo "cassandra-cluster.sh: $*" >&2; }
die() { log "$*"; exit 1; }

# Runs scripts/cassandra.sh COMMAND for node N (1-based).
node() {
    local n="$1" command="$2"
    shift 2
    [[ "$n" =~ ^[1-3]$ ]] || die "node must be 1, 2 or 3, not '$n'"
    FANOUT_CASSANDRA_NODE_HOST="${NODES[n - 1]}" \
        FANOUT_CASSANDRA_NODE_RUN="$ROOT/cluster/node$n" \
        FANOUT_CASSANDRA_NODE_CQL_PORT="$PORT" \
        FANOUT_CASSANDRA_NODE_STORAGE_PORT="$STORAGE_PORT" \
        FANOUT_CASSANDRA_NODE_CLUSTER=fanout-test-cluster \
        FANOUT_CASSANDRA_NODE_SEED="$SEED" \
        FANOUT_CASSANDRA_NODE_JOIN=1 \
        FANOUT_CASSANDRA_HEAP="$HEAP" \
        FANOUT_CASSANDRA_WAIT="$WAIT_SECONDS" \
        bash "$HERE/cassandra.sh" "$command" "$@"
}

pid_of() {
    local n="$1" pid
    pid="$(cat "$ROOT/cluster/node$n/cassandra.pid" 2>/dev/null)" || die "node $n was not started by this script"
    [[ "$pid" =~ ^[0-9]+$ ]] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q CassandraDaemon \
        || die "node $n is not running"
    echo "$pid"
}

# Loopback addresses other than 127.0.0.1 answer on Linux without setup;
# elsewhere (macOS) they must be added to lo0 first.
check_addresses() {
    local a
    for a in "${NODES[@]}"; do
        local answer
        answer="$( (exec 3<>"/dev/tcp/$a/1") 2>&1 || true)"
        [[ "$answer" == *refused* ]] || die "$a does not answer: add it to the loopback interface"
    done
}

# Every node lists the two others as up in its log.
wait_for_ring() {
    local started=$SECONDS n other
    while ((SECONDS - started < WAIT_SECONDS)); do
        local all=1
        for n in 1 2 3; do
            for other in "${NODES[@]}"; do
                [[ "$other" == "${NODES[n - 1]}" ]] && continue
                grep -q "/$other:$STORAGE_PORT is now UP" "$ROOT/cluster/node$n/logs/system.log" 2>/dev/null || all=0
            done
        done
        if ((all)); then
            log "the three nodes see each other (waited $((SECONDS - started)) s)"
            return 0
        fi
        sleep 1
    done
    die "the nodes did not all see each other within ${WAIT_SECONDS} s"
}

cmd_start() {
    bash "$HERE/cassandra.sh" install
    check_addresses
    local started=$SECONDS
    node 1 start
    # The others join side by side once the seed answers.
    node 2 start &
    local two=$!
    node 3 start &
    local three=$!
    wait "$two" || die "node 2 did not start"
    wait "$three" || die "node 3 did not start"
    wait_for_ring
    log "cluster up on $(cmd_nodes) in $((SECONDS - started)) s"
}

cmd_stop() {
    local n
    for n in 1 2 3; do
        # A paused node cannot act on SIGTERM.
        if pid="$(pid_of "$n" 2>/dev/null)"; then
            kill -CONT "$pid" 2>/dev/null || true
        fi
        node "$n" stop &
    done
    wait
}

cmd_wipe() {
    cmd_stop
    rm -rf "$ROOT/cluster"
    log "the cluster's data is gone"
}

cmd_nodes() {
    local out=() a
    for a in "${NODES[@]}"; do out+=("$a:$PORT"); done
    (IFS=,; echo "${out[*]}")
}

cmd_status() {
    local n rc=0 pid
    for n in 1 2 3; do
        if pid="$(pid_of "$n" 2>/dev/null)" && [[ "$(awk '{print $3}' "/proc/$pid/stat")" == T ]]; then
            echo "node $n (${NODES[n - 1]}:$PORT): paused (pid $pid)"
            continue
        fi
        echo -n "node $n (${NODES[n - 1]}:$PORT): "
        node "$n" status || rc=3
    done
    return "$rc"
}

n="${2:-}"
case "${1:-}" in
    start) cmd_start ;;
    stop) cmd_stop ;;
    wipe) cmd_wipe ;;
    status) cmd_status ;;
    nodes) cmd_nodes ;;
    kill) pid="$(pid_of "$n")"; kill -KILL "$pid"; log "node $n (pid $pid) killed" ;;
    pause) pid="$(pid_of "$n")"; kill -STOP "$pid"; log "node $n (pid $pid) paused" ;;
    resume) pid="$(pid_of "$n")"; kill -CONT "$pid"; log "node $n (pid $pid) resumed" ;;
    restart) node "$n" start ;;
    pid) pid_of "$n" ;;
    logs) node "$n" logs "${3:-100}" ;;
    *)
        echo "usage: $0 {start|stop|wipe|status|nodes|kill N|pause N|resume N|restart N|pid N|logs N [LINES]}" >&2
        exit 2
        ;;
esac
