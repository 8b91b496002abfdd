# etcd_cluster.sh: what the elastic tests share: their scratch set-up, and a
# three-member etcd cluster, one member in each emulated
# region, for the elastic tests (tests/wan/test_elastic.sh,
# tests/wan/test_elastic_torch.sh).  Sourced; the caller defines
#   WAN   (tools/geoccl-wan), NAME (its namespace prefix), addr G (the
#   address of region G's host) and TOKEN (names this cluster's members);
#   elastic_scratch sets WORK and PIDS.
# Members listen on port 2379 (clients, the v3 JSON gateway) and 2380
# (peers) at their region's address.

# elastic_scratch PREFIX: the environment both tests start from (no
# GeoCCL variable of the caller's), WORK (a scratch folder under /tmp
# named PREFIX.*), PIDS (every rank and etcd member started: killed at
# exit, with the WAN taken down and WORK removed, or kept with KEEP=1).
elastic_scratch() {
    unset GEOCCL_SOCKET_IFNAME GEOCCL_REGION GEOCCL_TOPO_FILE GEOCCL_ALGO GEOCCL_TIMEOUT \
          GEOCCL_COMPRESS GEOCCL_ELASTIC_ETCD GEOCCL_ELASTIC_JOB GEOCCL_PROBE
    export GEOCCL_DEBUG=${GEOCCL_DEBUG:-WARN}
    WORK=$(mktemp -d "/tmp/$1.XXXXXX") || exit 1
    PIDS=()
    trap elastic_cleanup EXIT
    trap 'echo "interrupted"; exit 130' INT TERM
}
# shellcheck disable=SC2317  # called by the trap
elastic_cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
    wait
    "$WAN" down -n "$NAME" -q > /dev/null 2>&1
    if [ -n "${KEEP:-}" ]; then echo "== kept $WORK"; else rm -rf "$WORK"; fi
}

# The etcd members for a process of region G: its own first.
endpoints() {
    local g=$1 k list="$(addr "$1"):2379"
    for k in 0 1 2; do [ "$k" = "$g" ] || list="$list,$(addr "$k"):2379"; done
    echo "$list"
}

ETCD_PID=()
# etcd_up CASE: a 3-member cluster, one member per region, fresh data; up
# when a write (which needs a quorum) succeeds through region 0's member.
etcd_up() {
    local c=$1 g cluster="" i
    for g in 0 1 2; do cluster="$cluster${cluster:+,}e$g=http://$(addr "$g"):2380"; done
    for g in 0 1 2; do
        (
            "$WAN" exec -n "$NAME" -i "$g" -- etcd --name "e$g" --data-dir "$WORK/etcd-$c-$g" \
                --listen-client-urls "http://$(addr "$g"):2379" \
                --advertise-client-urls "http://$(addr "$g"):2379" \
                --listen-peer-urls "http://$(addr "$g"):2380" \
                --initial-advertise-peer-urls "http://$(addr "$g"):2380" \
                --initial-cluster "$cluster" --initial-cluster-token "$TOKEN-$c-$$" \
                --initial-cluster-state new > "$WORK/etcd-$c-$g.log" 2>&1 &
            echo $! > "$WORK/etcd-$c-$g.pid"
            wait $!
        ) 2> /dev/null &   # no "Killed" notes: the kills are the test's
        while [ ! -s "$WORK/etcd-$c-$g.pid" ]; do sleep 0.01; done
        ETCD_PID[$g]=$(cat "$WORK/etcd-$c-$g.pid")
        PIDS+=("${ETCD_PID[$g]}")
    done
    for i in $(seq 200); do
        ip netns exec "$NAME-r0" curl -s -m 2 -X POST "http://$(addr 0):2379/v3/kv/put" \
            -d '{"key":"cGluZw==","value":"eA=="}' 2>/dev/null | grep -q revision && return 0
        sleep 0.1
    done
    tail -n 5 "$WORK/etcd-$c-0.log"
    echo "etcd did not come up"
    exit 1
}

etcd_down() { local g; for g in 0 1 2; do [ -n "${ETCD_PID[$g]:-}" ] && kill -9 "${ETCD_PID[$g]}" 2>/dev/null; done; }
