#!/usr/bin/env bash
#
# The multi-host recipes of docs/multi-host.md, run as they are written on
# six emulated machines (tests/helpers/emu_hosts.sh: network namespaces
# gh-eu-1 ... gh-ap-2 on a bridge, each with its machine's host name), each
# with region labels and without:
#
#   torchrun static and with the c10d rendezvous: Debian's torchrun on every
#       machine, train.py = tests/torch/recipe_step.py (all-reduces checked
#       exactly, one DDP step equal on every rank);
#   mpirun with a host file: Open MPI starts its daemons with
#       tests/helpers/netns_rsh in place of ssh; examples/mpi_allreduce
#       checks GeoCCL against MPI_Allreduce bit for bit;
#   Slurm: slurmctld on eu-1, a slurmd on every machine, the batch script
#       through sbatch: examples/minimal (GEOCCL_COMM_ID and a secret,
#       checked exactly) and, with labels, srun torchrun.
#
# With labels rank 0 must print three regions of 2 ranks (and torch ranks
# count bytes between regions); without, none (the machines have no delay
# between them, so the probe finds one region).
#
#   sudo GEOCCL_TEST_BUILDDIR=build bash tests/wan/test_recipes.sh
#
# Needs root and network namespaces (exit 77 otherwise); a part whose
# launcher or program is missing (torch, Open MPI, Slurm) is skipped and
# said so. About 2.5 minutes. The last line is always "N passed, N failed".
#
set -uo pipefail

cd "$(dirname "$0")/../.." || exit 1
SRC=$PWD
. tests/helpers/wan_common.sh
. tests/helpers/emu_hosts.sh
BUILD=${GEOCCL_TEST_BUILDDIR:-}
[ -z "$BUILD" ] && { [ -f build/Makefile ] && BUILD=$SRC/build || BUILD=$SRC; }
BUILD=$(cd "$BUILD" && pwd)
PYTHON=${GEOCCL_PYTHON:-/usr/bin/python3}
WAIT_MAX=${WAIT_MAX:-600}
DOC=$SRC/docs/multi-host.md
HOSTS=(eu-1 eu-2 us-1 us-2 ap-1 ap-2)

[ "$(id -u)" = 0 ] || skip "needs root (network namespaces); run: sudo bash $0"
if ! command -v ip >/dev/null 2>&1 || ! ip netns list >/dev/null 2>&1; then skip "no 'ip netns' here"; fi
command -v unshare >/dev/null 2>&1 || skip "no unshare (util-linux)"

WORK=$(mktemp -d /tmp/geoccl-recipes.XXXXXX) || exit 1
chmod 755 "$WORK"
wan_lock
# shellcheck disable=SC2317  # called by the trap
cleanup() {
    hosts_down
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'echo "interrupted"; exit 130' INT TERM
hosts_down
hosts_up "${HOSTS[@]}" || { echo "cannot make the emulated machines"; exit 1; }

# recipe NAME: the lines of the block ```LANG recipe=NAME of the page.
recipe() {
    awk -v tag="recipe=$1" 'on && /^```/ { exit } on { print } /^```/ && $NF == tag { on = 1 }' "$DOC"
}
# The page's /shared is this test's folder.
shared() { sed "s#/shared/#$WORK/#g"; }

recipe regions.topo > "$WORK/regions.topo"
[ -s "$WORK/regions.topo" ] || { echo "docs/multi-host.md has no regions.topo block"; exit 1; }

# check_regions N LOG...: rank 0 printed N regions of 2 ranks (3 per run
# with labels) and no other region.
check_regions() {
    local want=$1 n all
    shift
    n=$(cat "$@" | grep -c "region [0-9] '\(eu\|us\|ap\)': 2 ranks")
    all=$(cat "$@" | grep -c "region [0-9] '")
    [ "$n" = "$want" ] && [ "$all" = "$want" ] && return 0
    { echo "   expected $want lines of regions of 2 ranks from rank 0, got:"; cat "$@" | grep "region [0-9] '"; return 1; }
}
regions() { [ "$1" = yes ] && echo 3 || echo 0; }

# Debian's torchrun is `python3 -m torch.distributed.run` and needs three
# options (docs/multi-host.md); this `torchrun` is that and nothing else.
mkdir -p "$WORK/bin"
cat > "$WORK/bin/torchrun" <<EOF
#!/bin/sh
exec "$PYTHON" -m torch.distributed.run --redirects 1 --tee 1 --log_dir "\$(mktemp -d "$WORK/torchrun.XXXXXX")" "\$@"
EOF
chmod +x "$WORK/bin/torchrun"
cp "$SRC/tests/torch/recipe_step.py" "$WORK/train.py"
export PATH="$WORK/bin:$PATH" PYTHONPATH="$BUILD" NPROC=1 GEOCCL_DEBUG=INFO GEOCCL_DEBUG_SUBSYS=INIT
unset GEOCCL_SOCKET_IFNAME

# check_torch_ranks LABELS LOG...: 6 ranks said recipe-ok, and counted
# bytes between regions exactly when there were regions.
check_torch_ranks() {
    local labels=$1 ok wan
    shift
    ok=$(cat "$@" | grep -o 'recipe-ok rank [0-9]* of 6' | sort -u | wc -l)
    [ "$ok" = 6 ] || { echo "   $ok of 6 ranks passed their checks"; cat "$@" | grep -a 'recipe-FAIL\|Error' | head -5; return 1; }
    wan=$(cat "$@" | grep -o 'recipe-ok .* bytes_wan [0-9]*' | awk '$NF > 0' | wc -l)
    if [ "$labels" = yes ]; then
        [ "$wan" = 6 ] || { echo "   $wan of 6 ranks sent bytes between regions"; return 1; }
    else
        [ "$wan" = 0 ] || { echo "   $wan ranks sent bytes between regions without labels"; return 1; }
    fi
}
check_torch() { check_torch_ranks "$@" && check_regions "$(regions "$1")" "${@:2}"; }

# torchrun KIND LABELS: the block torchrun-KIND on every machine at once.
run_torchrun() {
    local kind=$1 labels=$2 i h t0 rc=0 pids=() logs=()
    local script=$WORK/torchrun-$kind-$labels.sh
    recipe "torchrun-$kind" > "$script"
    # shellcheck disable=SC2016  # the page's text, not an expansion
    [ "$labels" = no ] && sed -i 's/GEOCCL_REGION=\$REGION //' "$script"
    grep -q torchrun "$script" || { fail "torchrun $kind: no block in docs/multi-host.md"; return; }
    t0=$(now)
    for i in "${!HOSTS[@]}"; do
        h=${HOSTS[$i]}
        logs+=("$WORK/torchrun-$kind-$labels.$h.log")
        NODE_RANK=$i REGION=${h%-*} on "$h" timeout 120 bash -c "cd '$WORK' && . '$script'" \
            > "${logs[-1]}" 2>&1 &
        pids+=($!)
    done
    for i in "${!pids[@]}"; do
        wait "${pids[$i]}" || { rc=$?; echo "   ${HOSTS[$i]}: status $rc"; tail -5 "${logs[$i]}"; }
    done
    if [ "$rc" = 0 ] && check_torch "$labels" "${logs[@]}"; then
        pass "torchrun $kind, labels: $labels ($(since "$t0" "$(now)") s)"
    else
        fail "torchrun $kind, labels: $labels"
    fi
}

if [ -z "${GEOCCL_SANITIZE:-}" ] && [ -f "$BUILD/geoccl/_C.so" ] &&
   "$PYTHON" -c 'import torch.distributed.run' 2>/dev/null; then
    run_torchrun static yes
    run_torchrun static no
    run_torchrun rdzv yes
    run_torchrun rdzv no
    have_torch=1
else
    echo "SKIP: torchrun ($BUILD/geoccl/_C.so not built, $PYTHON has no torch, or a sanitizer build)"
    have_torch=0
fi

# mpirun LABELS: the block on eu-1; Open MPI reaches the others through
# netns_rsh; rank 0, on eu-1, has mpirun's environment (the logging).
run_mpirun() {
    local labels=$1 t0
    local log=$WORK/mpirun-$labels.log script=$WORK/mpirun-$labels.sh
    recipe mpirun | shared > "$script"
    [ "$labels" = no ] && sed -i "s# -x GEOCCL_TOPO_FILE=$WORK/regions.topo##" "$script"
    t0=$(now)
    if OMPI_MCA_plm_rsh_agent=$SRC/tests/helpers/netns_rsh OMPI_ALLOW_RUN_AS_ROOT=1 \
       OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
       on eu-1 timeout 120 bash -c "cd '$WORK' && . '$script'" > "$log" 2>&1 &&
       [ "$(grep -c ' ok$' "$log")" -ge 6 ] && ! grep -q WRONG "$log" && check_regions "$(regions "$labels")" "$log"; then
        pass "mpirun with a host file, labels: $labels ($(since "$t0" "$(now)") s)"
    else
        tail -15 "$log"
        fail "mpirun with a host file, labels: $labels"
    fi
}

if command -v mpirun >/dev/null 2>&1 && [ -x "$BUILD/examples/mpi_allreduce" ]; then
    ln -s "$BUILD/examples/mpi_allreduce" "$WORK/mpi_allreduce"
    run_mpirun yes
    run_mpirun no
else
    echo "SKIP: mpirun (no mpirun, or $BUILD/examples/mpi_allreduce not built)"
fi

# ---- Slurm ---------------------------------------------------------------

# The cgroup file systems as the root namespace has them, for slurmd's own
# mount namespace (ip netns exec mounts a fresh /sys): slurmd 22.05 starts
# its cgroup plugin even with proctrack/linuxproc and task/none.
cgroup_mounts() {
    awk '$2 ~ "^/sys/fs/cgroup" { printf "mkdir -p %s && mount -t %s -o %s %s %s && ", $2, $3, $4, $3, $2 }' /proc/self/mounts
}

slurm_up() {
    local d=$WORK/slurm i h state t0=$SECONDS
    mkdir -p "$d/state"
    cat > "$d/slurm.conf" <<EOF
ClusterName=geoccl
SlurmctldHost=eu-1($EMU_SUBNET.11)
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool-%n
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd-%n.pid
SlurmctldLogFile=$d/slurmctld.log
SlurmdLogFile=$d/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
EOF
    for i in "${!HOSTS[@]}"; do
        echo "NodeName=${HOSTS[$i]} NodeAddr=$(emu_addr "${HOSTS[$i]}") CPUs=$(nproc) State=UNKNOWN"
    done >> "$d/slurm.conf"
    echo "PartitionName=all Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >> "$d/slurm.conf"
    export SLURM_CONF=$d/slurm.conf
    on eu-1 slurmctld -D -f "$SLURM_CONF" > "$d/slurmctld.out" 2>&1 &
    for h in "${HOSTS[@]}"; do
        mkdir -p "$d/spool-$h"
        on "$h" sh -c "$(cgroup_mounts) exec slurmd -D -N $h -f '$SLURM_CONF'" > "$d/slurmd-$h.out" 2>&1 &
    done
    while [ $((SECONDS - t0)) -lt 60 ]; do
        state=$(on eu-1 sinfo -h -o '%T %D' 2>/dev/null)
        [ "$state" = "idle 6" ] && return 0
        sleep 1
    done
    echo "   the nodes did not come up within 60 s: sinfo says '$state'"
    tail -3 "$d"/*.out
    return 1
}

# sbatch LABELS: the batch script through sbatch --wait on eu-1; its torch
# step (the same srun torchrun as above, 35 s) only with labels.
run_sbatch() {
    local labels=$1 t0 rc torch=$have_torch
    local job=$WORK/job-$labels.sh out=$WORK/slurm-$labels.out
    recipe sbatch | shared > "$job"
    [ "$labels" = no ] && sed -i '/^export GEOCCL_TOPO_FILE=/d' "$job"
    [ "$labels" = yes ] || torch=0
    [ "$torch" = 1 ] || sed -i '/^# torch:/,$d' "$job"
    t0=$(now)
    on eu-1 timeout 300 sbatch --wait -o "$out" "$job" > "$WORK/sbatch-$labels.log" 2>&1
    rc=$?
    if [ "$rc" = 0 ] && [ "$(grep -c 'rank [0-5] of 6: all-reduce of .* ok' "$out")" = 6 ] &&
       check_regions $(($(regions "$labels") * (torch ? 2 : 1))) "$out" &&
       { [ "$torch" = 0 ] || check_torch_ranks "$labels" "$out"; }; then
        pass "Slurm batch script (srun$([ "$torch" = 1 ] && echo ", srun torchrun"))," \
             "labels: $labels ($(since "$t0" "$(now)") s)"
    else
        echo "   sbatch status $rc"
        cat "$WORK/sbatch-$labels.log"
        tail -20 "$out" 2>/dev/null
        fail "Slurm batch script, labels: $labels"
    fi
}

if command -v slurmctld >/dev/null 2>&1 && command -v slurmd >/dev/null 2>&1 &&
   command -v sbatch >/dev/null 2>&1 && [ -x "$BUILD/examples/minimal" ]; then
    ln -s "$BUILD/examples/minimal" "$WORK/minimal"
    if slurm_up; then
        run_sbatch yes
        run_sbatch no
    else
        fail "Slurm: slurmctld and six slurmd"
    fi
else
    echo "SKIP: Slurm (slurmctld, slurmd, sbatch: config/install-deps.sh installs them; or $BUILD/examples/minimal not built)"
fi

finish
