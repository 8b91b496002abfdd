#!/usr/bin/env bash
#
# run_regions.sh: the training example (train.c) across emulated regions,
# once per gradient codec, with the same seed, and a table of the final
# test accuracies.
#
#   sudo examples/train/run_regions.sh [options] [CODEC...] [-- TRAIN_OPTIONS...]
#
# CODEC is a value of GEOCCL_COMPRESS (none, lossless, fp16, bf16, int8,
# int4, sign, topk:K, ...), optionally followed by "+noef" to turn error
# feedback off for that run (GEOCCL_EF=0), e.g. `sign+noef`. Default: none.
# TRAIN_OPTIONS go to every run (default: --epochs 30 --seed 1).
#
# The regions come from tools/geoccl-wan (needs root): R regions
# (default 3) of P ranks (default 2), every region's link to the others
# shaped to --rate (default 100mbit) and delayed --delay one way (default
# 25ms). Only one emulated WAN can be up on a machine; while another one is
# (`geoccl-wan status`), the script waits for it to go down. The WAN is
# brought up once for all the runs, and a trap always takes it down again:
# at the end, on failure, on Ctrl-C or SIGTERM.
#
# Options:
#   -r R              regions (default 3)
#   -p P              ranks per region (default 2)
#   --rate RATE       egress rate of each region, tc units (default 100mbit)
#   --delay D         one-way delay of each region (default 25ms)
#   --launch mpi|env  mpi: examples/train/train-mpi under mpirun, placed in
#                     the regions with `geoccl-wan mpirun-args`; env: one
#                     examples/train/train per rank, GEOCCL_COMM_ID/RANK/NRANKS.
#                     Default: mpi when train-mpi is built and mpirun exists.
#   -B DIR            build directory holding examples/train/ (default: the
#                     top of this source tree)
#   -o DIR            where the logs and summary go (default: a new /tmp dir)
#   -n NAME           name of the emulated WAN (default gtrain)
#   --wait-max S      give up after waiting S seconds for another WAN to go
#                     down (default 0: wait as long as it takes)
#   --timeout S       limit per training run (default 3600)
#   -h, --help
#
# Environment: MPIRUN (default mpirun). GEOCCL_* variables are passed on to
# the ranks (GEOCCL_EF applies to every codec without "+noef").
#
# Exit status: 0 when every run finished; 1 when one failed (the table
# says which); 2 for a usage error; 77 when the machine cannot emulate
# regions (not root, no network namespaces).
#
set -uo pipefail
# The ranks bootstrap at GEOCCL_COMM_ID across regions, where traffic is
# encrypted: they share a random 256-bit key for this run.
export GEOCCL_COMM_SECRET=${GEOCCL_COMM_SECRET:-$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')}

PROG=${0##*/}
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
wan=$top/tools/geoccl-wan

regions=3
per=2
rate=100mbit
delay=25ms
launch=
builddir=$top
outdir=
name=gtrain
wait_max=0
run_timeout=3600
codecs=()
train_args=()

usage() { sed -n '3,/^set -uo/p' "$0" | sed -e '/^set -uo/d' -e 's/^# \{0,1\}//'; }
die() { echo "$PROG: $*" >&2; exit 2; }
log() { echo "== $*"; }

while [ $# -gt 0 ]; do
    case $1 in
        -r) regions=${2:?-r needs a count}; shift 2;;
        -p) per=${2:?-p needs a count}; shift 2;;
        --rate) rate=${2:?--rate needs a rate}; shift 2;;
        --delay) delay=${2:?--delay needs a delay}; shift 2;;
        --launch) launch=${2:?--launch needs mpi or env}; shift 2;;
        -B) builddir=${2:?-B needs a directory}; shift 2;;
        -o) outdir=${2:?-o needs a directory}; shift 2;;
        -n) name=${2:?-n needs a name}; shift 2;;
        --wait-max) wait_max=${2:?--wait-max needs seconds}; shift 2;;
        --timeout) run_timeout=${2:?--timeout needs seconds}; shift 2;;
        -h|--help) usage; exit 0;;
        --) shift; train_args=("$@"); break;;
        -*) die "unknown option '$1' (see --help)";;
        *) codecs+=("$1"); shift;;
    esac
done
[ ${#codecs[@]} -gt 0 ] || codecs=(none)
[ ${#train_args[@]} -gt 0 ] || train_args=(--epochs 30 --seed 1)
for v in "$regions" "$per" "$wait_max" "$run_timeout"; do
    [[ $v =~ ^[0-9]+$ ]] || die "'$v': want a whole number"
done
if [ "$regions" -lt 1 ] || [ "$per" -lt 1 ]; then die "-r and -p want at least 1"; fi
nranks=$((regions * per))

mpirun=${MPIRUN:-mpirun}
bin_env=$builddir/examples/train/train
bin_mpi=$builddir/examples/train/train-mpi
if [ -z "$launch" ]; then
    if [ -x "$bin_mpi" ] && command -v "$mpirun" >/dev/null 2>&1; then launch="mpi"; else launch="env"; fi
fi
case $launch in
    mpi) [ -x "$bin_mpi" ] || die "$bin_mpi is not built (configure found MPI? or use --launch env)"
         command -v "$mpirun" >/dev/null 2>&1 || die "$mpirun not found (set MPIRUN, or --launch env)";;
    env) [ -x "$bin_env" ] || die "$bin_env is not built (run make; or give the build directory with -B)";;
    *) die "--launch $launch: want mpi or env";;
esac

if [ "$(id -u)" != 0 ]; then
    echo "$PROG: the emulated regions need root (network namespaces, tc); try sudo" >&2
    exit 77
fi
[ -x "$wan" ] || { echo "$PROG: $wan not found" >&2; exit 77; }

if [ -z "$outdir" ]; then
    outdir=$(mktemp -d /tmp/geoccl-train.XXXXXX) || exit 1
else
    mkdir -p "$outdir" || exit 1
fi

# ---- the WAN: wait for the machine's one slot, bring ours up, always down

wan_ours=0
children=()
# shellcheck disable=SC2317  # run by the traps
cleanup() {
    local rc=$?
    trap - EXIT INT TERM HUP
    if [ ${#children[@]} -gt 0 ]; then
        kill -TERM "${children[@]}" 2>/dev/null
        wait "${children[@]}" 2>/dev/null
    fi
    if [ "$wan_ours" = 1 ]; then
        "$wan" down -n "$name" -q || echo "$PROG: '$wan down -n $name' failed; run it by hand" >&2
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'echo "$PROG: interrupted" >&2; exit 130' INT
trap 'echo "$PROG: terminated" >&2; exit 143' TERM HUP

# True while some emulated WAN (anyone's) is up: they all use the same
# subnet, so only one can be.
other_wan_up() {
    local s
    s=$("$wan" status 2>/dev/null) || return 0
    [[ $s != "no emulated WAN is up"* ]]
}

waited=0
said=0
while :; do
    if other_wan_up; then
        if [ "$said" = 0 ] || [ $((waited % 600)) = 0 ]; then
            log "another emulated WAN is up; waiting for it to go down (polling every 20 s):"
            "$wan" status 2>&1 | grep "region(s)" | sed 's/^/   /'
            echo "   (if it is a stale one of ours: $wan down -n $name)"
            said=1
        fi
        if [ "$wait_max" -gt 0 ] && [ "$waited" -ge "$wait_max" ]; then
            echo "$PROG: waited $waited s for the other WAN; giving up" >&2
            exit 1
        fi
        sleep 20 & children=($!); wait "${children[0]}"; children=()
        waited=$((waited + 20))
        continue
    fi
    # up cleans up after itself when it fails; a WAN that someone else
    # brought up in the meantime makes it fail, and we wait again.
    if "$wan" up -n "$name" -r "$regions" --rate "$rate" --delay "$delay" -q > "$outdir/wan-up.log" 2>&1; then
        wan_ours=1
        break
    fi
    if other_wan_up && ! grep -q "'$name' is already" "$outdir/wan-up.log"; then
        continue
    fi
    echo "$PROG: could not bring the emulated WAN up:" >&2
    cat "$outdir/wan-up.log" >&2
    exit 1
done
[ "$waited" -gt 0 ] && log "waited $waited s for the other WAN"
log "'$name' up: $regions regions x $per ranks, $rate and $delay one way between regions ($(date -u '+%F %T') UTC)"
"$wan" status -n "$name" | sed 's/^/   /' > "$outdir/wan-status.txt"
{ echo "regions=$regions per=$per rate=$rate delay=$delay launch=$launch"
  echo "train options: ${train_args[*]}"; } > "$outdir/setup.txt"

# ---- the runs -----------------------------------------------------------

port=29900
# One training run; rank 0's output goes to $1, the others' to $1.rankN.
run_one() {  # LOG CODEC EF(0|1|'')
    local out=$1 codec=$2 ef=$3 r i
    local -a envs=(GEOCCL_COMPRESS="$codec" GEOCCL_SOCKET_IFNAME=wan0)
    [ -n "$ef" ] && envs+=(GEOCCL_EF="$ef")
    if [ "$launch" = mpi ]; then
        local -a penv opts line
        mapfile -t penv < <("$wan" mpirun-args -n "$name" --env | sed -n 's/^export //p')
        read -r -a opts <<< "$("$wan" mpirun-args -n "$name")"
        line=(env "${penv[@]}" "$mpirun" "${opts[@]}" --oversubscribe --bind-to none)
        for ((i = 0; i < regions; i++)); do
            [ "$i" -gt 0 ] && line+=(:)
            line+=(-np "$per" "$wan" exec -n "$name" -i "$i" -- env "${envs[@]}" "$bin_mpi" "${train_args[@]}")
        done
        echo "${line[*]}" > "$out.cmd"
        timeout -k 10 "$run_timeout" "${line[@]}" > "$out" 2> "$out.err" &
        children=($!)
    else
        port=$((port + 1))
        children=()
        : > "$out.cmd"
        for ((r = 0; r < nranks; r++)); do
            local -a cmd=("$wan" exec -n "$name" -i $((r / per)) -- env "${envs[@]}" "RANK=$r" "NRANKS=$nranks"
                          GEOCCL_COMM_ID="10.231.0.10:$port" "$bin_env" "${train_args[@]}")
            echo "${cmd[*]}" >> "$out.cmd"
            if [ "$r" = 0 ]; then
                timeout -k 10 "$run_timeout" "${cmd[@]}" > "$out" 2> "$out.err" &
            else
                timeout -k 10 "$run_timeout" "${cmd[@]}" > "$out.rank$r" 2>&1 &
            fi
            children+=($!)
        done
    fi
    local rc=0 p
    for p in "${children[@]}"; do wait "$p" || { local e=$?; [ "$rc" = 0 ] && rc=$e; }; done
    children=()
    return "$rc"
}

status=0
rows=()
none_acc=
for spec in "${codecs[@]}"; do
    codec=${spec%+noef}
    ef=${GEOCCL_EF:-}
    [ "$codec" != "$spec" ] && ef=0
    efword=on
    [ "$ef" = 0 ] && efword=off
    file=$outdir/train-${spec//[^A-Za-z0-9.+_-]/_}.log
    log "codec $codec, error feedback $efword: $launch, ${train_args[*]} -> $file"
    t0=$(date +%s)
    run_one "$file" "$codec" "$ef"; rc=$?
    t1=$(date +%s)
    grep -E '^ *[0-9]+ ' "$file" | tail -n 3 | sed 's/^/   /'
    final=$(grep '^final test accuracy' "$file" | tail -n 1)
    if [ "$rc" != 0 ] || [ -z "$final" ]; then
        echo "   FAILED (exit $rc); last lines of $file.err:"
        tail -n 8 "$file.err" 2>/dev/null | sed 's/^/   | /'
        status=1
        rows+=("$(printf '%-16s %-5s %10s %10s %9s %9s  %s' "$codec" "$efword" "failed" "-" "$((t1 - t0))" "-" "(exit $rc)")")
        continue
    fi
    echo "   $final"
    acc=$(sed -n 's/^final test accuracy \([0-9.]*\)%.*/\1/p' <<< "$final")
    note=
    [[ $final == *"[not applied"* ]] && note="codec not applied: this libgeoccl has no GEOCCL_COMPRESS"
    wanmb=$(awk '$1 ~ /^[0-9]+$/ && NF >= 6 { s += $6 } END { printf "%.1f", s }' "$file")
    [ "$codec" = none ] && [ -z "$none_acc" ] && none_acc=$acc
    rows+=("$codec|$efword|$acc|$((t1 - t0))|$wanmb|$note")
done

# ---- summary ------------------------------------------------------------

{
    echo
    echo "Training across $regions regions x $per ranks ($rate, $delay one way), $launch launch, options: ${train_args[*]}"
    echo "$(date -u '+%F %T') UTC, logs in $outdir"
    printf '%-16s %-5s %10s %10s %9s %9s\n' codec EF "test acc" "vs none" "seconds" "WAN MB"
    for row in "${rows[@]}"; do
        if [[ $row != *"|"* ]]; then echo "$row"; continue; fi
        IFS='|' read -r c e a s w n <<< "$row"
        d=-
        [ -n "$none_acc" ] && d=$(awk -v a="$a" -v b="$none_acc" 'BEGIN { printf "%+.2f", a - b }')
        printf '%-16s %-5s %9s%% %10s %9s %9s%s\n' "$c" "$e" "$a" "$d" "$s" "$w" "${n:+  $n}"
    done
    echo "(seconds: the whole run, start-up included; WAN MB: bytes all ranks sent between regions in training)"
} | tee "$outdir/summary.txt"
exit "$status"
