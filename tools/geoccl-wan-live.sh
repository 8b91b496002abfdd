# shellcheck shell=bash disable=SC2015,SC2034  # sourced by geoccl-wan (QUIET, NAME are its)
# geoccl-wan-live.sh: changing an emulated WAN while a job runs on it.
# Sourced by tools/geoccl-wan (it uses that script's helpers: cfg, die,
# state_dir, parse_rate, tbf_params, ...); not a program of its own.
#
#   set REGION key=value...    a region's link, now: rate, ingress, delay,
#                              jitter, loss, queue
#   show                       the values in force, as the kernel's shapers
#                              and the delay lines report them
#   schedule FILE | next | stop | status
#                              steps "T REGION key=value..." (or "T cross
#                              ...") in the background, at their time or on
#                              SIGUSR1 (schedule next)
#   cross start|stop|report|list
#                              N bulk TCP flows (iperf3) between two regions,
#                              their own throughput from iperf3's JSON
#
# The rules that make a change safe for what runs across the link:
# - a rate or queue change is `tc qdisc change` on the tbf that is there
#   (its child fifo and the packets in it stay; only the token bucket and
#   the limit are set anew), never a delete and add, which would drop the
#   queue; so no connection sees more than what the new rate itself does;
# - a delay, jitter or loss change goes to the running delay line (its
#   control file and SIGUSR2, delayline -c), which applies it to the
#   packets read from then on and keeps order; `set` returns once the delay
#   line has confirmed it (ctrl_gen in its stats file);
# - every change is appended to STATE/changes.log with its wall-clock time,
#   so a test can tell when a scheduled step took effect.

LIVE_NONE_BPS=40000000000       # "none" after up: a tbf no link here reaches
LIVE_CROSS_PORT=5400            # cross traffic: iperf3 ports from here up

# Sets key=value in the state's config (replaced, or added), atomically.
cfg_set() {
    local f
    f="$(state_dir)/config"
    awk -F= -v k="$1" -v v="$2" '$1 == k { print k "=" v; done = 1; next } { print }
        END { if (!done) print k "=" v }' "$f" > "$f.tmp.$$" && mv -f "$f.tmp.$$" "$f"
}

live_log() {
    printf '%s %s\n' "$EPOCHREALTIME" "$*" >> "$(state_dir)/changes.log"
}

# Runs a command; on failure says which and returns 1 (unlike must, which
# tears the WAN down: a failed change leaves the WAN as it was).
try() {
    local out
    out=$("$@" 2>&1) && return 0
    echo "$PROG: failed: $*" >&2
    [ -n "$out" ] && echo "  $out" >&2
    return 1
}

# "all" | "N" | "rN" | "N,M,..." -> region numbers, one a line.
live_regions() {
    local spec=$1 regions i
    local -a v
    regions=$(cfg regions) || die "'$NAME' is not up ($PROG status)"
    if [ "$spec" = all ] || [ "$spec" = '*' ]; then
        seq 0 $((regions - 1))
        return 0
    fi
    IFS=, read -r -a v <<< "$spec"
    for i in "${v[@]}"; do
        i=${i#r}
        [[ $i =~ ^[0-9]+$ ]] && [ "$i" -lt "$regions" ] ||
            die "region '$i': want 0..$((regions - 1)), rN, a comma list or all"
        echo "$i"
    done
}

# is_running for a pid read from a file, which may be empty.
live_running() { [[ ${1:-} =~ ^[0-9]+$ ]] && is_running "$1"; }

live_require_up() {
    check_name
    [ "$(id -u)" = 0 ] || cannot "$1 must run as root (tc, ip netns)"
    [ -f "$(state_dir)/config" ] || die "'$NAME' is not up ($PROG status)"
}

# The egress tbf on dl0 of region i: changed in place where there is one.
live_egress() {
    local i=$1 bps=$2 queue_ms=$3 had=$4 ns burst limit verb=change
    ns=$(ns_of "$i")
    [ "$bps" = 0 ] && bps=$LIVE_NONE_BPS
    read -r burst limit < <(tbf_params "$bps" "$queue_ms")
    # No tbf yet (up with rate none): the first one replaces the device's
    # default queue, which an unshaped link keeps empty.
    [ "$had" = 0 ] && verb=replace
    try ip netns exec "$ns" tc qdisc "$verb" dev dl0 root tbf rate "$bps" burst "$burst" limit "$limit"
}

# The ingress tbf of region i (see setup_ingress): changed in place, or
# made the first time a region's downlink is limited.
live_ingress() {
    local i=$1 bps=$2 queue_ms=$3 ns dev burst limit
    ns=$(ns_of "$i")
    dev=$(cfg "ingress_dev_$i" 2>/dev/null) || dev=
    if [ -z "$dev" ]; then
        [ "$bps" = 0 ] && return 0
        setup_ingress "$i" "$bps" "$queue_ms" try || return 1
        return 0
    fi
    [ "$bps" = 0 ] && bps=$LIVE_NONE_BPS
    read -r burst limit < <(tbf_params "$bps" "$queue_ms")
    if [ "$dev" = ifb0 ]; then
        try ip netns exec "$ns" tc qdisc change dev ifb0 root tbf rate "$bps" burst "$burst" limit "$limit"
    else
        try tc qdisc change dev "$dev" root tbf rate "$bps" burst "$burst" limit "$limit"
    fi
}

# Hands delay, jitter and loss to region i's delay line and waits (up to
# 3 s) until it says it applied them. ctl: "key value" lines.
live_delayline() {
    local i=$1 ctl=$2 sd pid gen t got
    sd=$(state_dir)
    pid=$(cat "$sd/dl$i.pid" 2>/dev/null)
    live_running "$pid" || { echo "$PROG: region $i: delay line not running" >&2; return 1; }
    gen=$(( $(cat "$sd/ctrl.gen" 2>/dev/null || echo 0) + 1 ))
    echo "$gen" > "$sd/ctrl.gen"
    printf '%sgen %s\n' "$ctl" "$gen" > "$sd/dl$i.ctrl.tmp" && mv -f "$sd/dl$i.ctrl.tmp" "$sd/dl$i.ctrl"
    kill -USR2 "$pid" || return 1
    for ((t = 0; t < 150; t++)); do
        got=$(awk '$1 == "ctrl_gen" { print $2 }' "$sd/dl$i.stats" 2>/dev/null)
        [ "$got" = "$gen" ] && return 0
        sleep 0.02
    done
    echo "$PROG: region $i: the delay line did not confirm the change within 3 s (its log: $sd/dl$i.log)" >&2
    tail -3 "$sd/dl$i.log" >&2
    return 1
}

do_set() {
    local -a keys=()
    local spec=''
    while [ $# -gt 0 ]; do
        case $1 in
            -n|--name) NAME=${2:-}; shift 2 || die "-n needs a name";;
            -q|--quiet) QUIET=1; shift;;
            *=*) keys+=("$1"); shift;;
            *) [ -z "$spec" ] || die "set: '$1': want key=value (rate, ingress, delay, jitter, loss, queue)"
               spec=$1; shift;;
        esac
    done
    [ -n "$spec" ] && [ ${#keys[@]} -gt 0 ] ||
        die "set: usage: $PROG set [-n NAME] REGION key=value... (keys: rate, ingress, delay, jitter, loss, queue)"
    live_require_up set
    local -a regs
    mapfile -t regs < <(live_regions "$spec") || exit 1
    [ ${#regs[@]} -gt 0 ] || exit 1

    # Every value checked before anything changes.
    local kv k v rate='' rate_bps='' ingress='' ingress_bps='' delay='' jitter='' loss='' queue=''
    for kv in "${keys[@]}"; do
        k=${kv%%=*} v=${kv#*=}
        case $k in
            rate|egress) rate=$v; rate_bps=$(parse_rate "$v") ||
                die "set: rate '$v': want e.g. 25mbit, 1gbit or none";;
            ingress|downlink) ingress=$v; ingress_bps=$(parse_rate "$v") ||
                die "set: ingress '$v': want e.g. 25mbit, 1gbit or none";;
            delay) delay=$(parse_delay "$v") ||
                die "set: delay '$v': want e.g. 60ms, 60, 500us, 0.1s";;
            jitter) [[ $v =~ ^[0-9]+([.][0-9]+)?(ms)?$ ]] || die "set: jitter '$v': want milliseconds"
                jitter=${v%ms};;
            loss) [[ $v =~ ^[0-9]+([.][0-9]+)?%?$ ]] && awk -v x="${v%\%}" 'BEGIN { exit !(x <= 100) }' ||
                    die "set: loss '$v': want a percentage in 0..100"
                loss=${v%\%}
                [ -z "$(cfg gilbert 2>/dev/null)" ] ||
                    die "set: loss: region(s) have Gilbert-Elliott loss (up --gilbert), which set cannot change";;
            queue) [[ $v =~ ^[0-9]+([.][0-9]+)?(ms)?$ ]] || die "set: queue '$v': want milliseconds"
                queue=${v%ms};;
            *) die "set: unknown key '$k' (keys: rate, ingress, delay, jitter, loss, queue)";;
        esac
    done

    lock_state
    local i rc=0 q old_bps ctl new_rate_bps dq shaped
    for i in "${regs[@]}"; do
        old_bps=$(cfg "rate_bps_$i")
        q=$(cfg "queue_ms_$i")
        # Without --queue at up the shaper's buffer follows the delay
        # (2 x D, at least 10 ms), as up chose it.
        if [ -n "$queue" ]; then
            q=$queue
        elif [ -n "$delay" ] && [ "$(cfg queue_auto 2>/dev/null)" != 0 ]; then
            q=$(awk -v d="$delay" 'BEGIN { q = 2 * d; if (q < 10) q = 10; printf "%.6g", q }')
        fi
        new_rate_bps=${rate_bps:-$old_bps}
        # shaped_I: region I's dl0 has a tbf (up with rate none has none
        # until a rate is set; rate none after that keeps it, unlimited).
        shaped=$(cfg "shaped_$i" 2>/dev/null) || shaped=$([ "$old_bps" = 0 ] && echo 0 || echo 1)
        if [ -n "$rate" ] || [ "$q" != "$(cfg "queue_ms_$i")" ]; then
            if [ "$new_rate_bps" != 0 ] || [ "$shaped" = 1 ]; then
                live_egress "$i" "$new_rate_bps" "$q" "$shaped" || { rc=1; continue; }
                cfg_set "shaped_$i" 1
            fi
            [ -n "$rate" ] && { cfg_set "rate_$i" "$rate"; cfg_set "rate_bps_$i" "$rate_bps"; }
        fi
        if [ -n "$ingress" ] || { [ "$q" != "$(cfg "queue_ms_$i")" ] && [ -n "$(cfg "ingress_dev_$i" 2>/dev/null)" ]; }; then
            local ib=${ingress_bps:-$(cfg "ingress_bps_$i" 2>/dev/null || echo 0)}
            if live_ingress "$i" "$ib" "$q"; then
                [ -n "$ingress" ] && { cfg_set "ingress_$i" "$ingress"; cfg_set "ingress_bps_$i" "$ingress_bps"; }
            else
                rc=1; continue
            fi
        fi
        cfg_set "queue_ms_$i" "$q"
        ctl=''
        [ -n "$delay" ] && ctl+="delay $delay"$'\n'
        [ -n "$jitter" ] && ctl+="jitter $jitter"$'\n'
        [ -n "$loss" ] && ctl+="loss $loss"$'\n'
        if [ -n "$ctl" ]; then
            if live_delayline "$i" "$ctl"; then
                [ -n "$delay" ] && cfg_set "delay_$i" "$delay"
                [ -n "$jitter" ] && cfg_set "jitter_$i" "$jitter"
                [ -n "$loss" ] && cfg_set "loss_$i" "$loss"
            else
                rc=1; continue
            fi
        fi
        # The delay line's ring was sized at up for 4 x rate x delay.
        dq=$(cfg "dlqueue_$i")
        awk -v r="$(cfg "rate_bps_$i")" -v d="$(cfg "delay_$i")" -v q="$dq" \
            'BEGIN { exit !(r > 0 && r / 8 * d / 1000 > q) }' &&
            echo "$PROG: warning: region $i: rate x delay is more than the $dq bytes its delay line can hold (sized at up); packets will be dropped" >&2
        live_log "set r$i ${keys[*]}"
        note "$PROG: r$i: ${keys[*]}"
    done
    exec 9>&-
    return $rc
}

# The rate of the tbf on a device, as tc prints it ("25Mbit"); "-" if none.
live_tbf_rate() {
    local out
    out=$("$@" 2>/dev/null | awk '$2 == "tbf" { for (i = 1; i < NF; i++) if ($i == "rate") { print $(i + 1); exit } }')
    echo "${out:--}"
}

do_show() {
    while [ $# -gt 0 ]; do
        case $1 in
            -n|--name) NAME=${2:-}; shift 2 || die "-n needs a name";;
            *) die "show: unknown option '$1'";;
        esac
    done
    live_require_up show
    local sd regions i ns pid stats dev t m0 eg ig dl
    sd=$(state_dir)
    regions=$(cfg regions)
    # Fresh delay-line values: SIGUSR1 rewrites the stats files.
    for ((i = 0; i < regions; i++)); do
        pid=$(cat "$sd/dl$i.pid" 2>/dev/null)
        live_running "$pid" && kill -USR1 "$pid" 2>/dev/null
    done
    sleep 0.2
    echo "'$NAME': values in force (config; what the shapers and delay lines report)"
    printf '  %-4s %-22s %-22s %-24s %-10s %-8s %s\n' region "rate (tbf on dl0)" "ingress (tbf)" \
        "one-way delay ms (line)" "jitter ms" "loss %" "queue ms"
    for ((i = 0; i < regions; i++)); do
        ns=$(ns_of "$i")
        eg=$(live_tbf_rate ip netns exec "$ns" tc qdisc show dev dl0)
        dev=$(cfg "ingress_dev_$i" 2>/dev/null) || dev=
        case $dev in
            '') ig=-;;
            ifb0) ig=$(live_tbf_rate ip netns exec "$ns" tc qdisc show dev ifb0);;
            *) ig=$(live_tbf_rate tc qdisc show dev "$dev");;
        esac
        stats=$sd/dl$i.stats
        dl=$(awk '$1 == "delay_ms" { print $2 }' "$stats" 2>/dev/null)
        printf '  r%-3s %-22s %-22s %-24s %-10s %-8s %s\n' "$i" "$(cfg "rate_$i") ($eg)" \
            "$(cfg "ingress_$i" 2>/dev/null || echo none) ($ig)" "$(cfg "delay_$i") (${dl:-?})" \
            "$(cfg "jitter_$i" 2>/dev/null || echo 0)" "$(cfg "loss_$i" 2>/dev/null || echo 0)" \
            "$(cfg "queue_ms_$i")"
    done
    pid=$(cat "$sd/schedule.pid" 2>/dev/null)
    if [ -n "$pid" ] && live_running "$pid"; then
        echo "  schedule: running (pid $pid), $(grep -c 'step' "$sd/schedule.log" 2>/dev/null) step(s) applied; log $sd/schedule.log"
    fi
    cross_list | sed 's/^/  /'
    if [ -s "$sd/changes.log" ]; then
        echo "  last changes (wall clock):"
        tail -5 "$sd/changes.log" | sed 's/^/    /'
    fi
    return 0
}

# ---- schedule ------------------------------------------------------------

# Checks a schedule file; prints its steps as "T<TAB>words" (T = @ for
# "on signal only"), or dies naming the bad line.
schedule_parse() {
    local file=$1 n=0 t rest last=0
    [ -r "$file" ] || die "schedule: cannot read '$file'"
    while IFS= read -r line || [ -n "$line" ]; do
        n=$((n + 1))
        line=${line%%#*}
        read -r t rest <<< "$line"
        [ -z "$t" ] && continue
        if [ "$t" != @ ]; then
            [[ $t =~ ^[0-9]+([.][0-9]+)?s?$ ]] || die "schedule $file:$n: '$t': want seconds after the start, or @ (on SIGUSR1 only)"
            t=${t%s}
            awk -v a="$t" -v b="$last" 'BEGIN { exit !(a >= b) }' ||
                die "schedule $file:$n: time $t is before the line above ($last): steps run in file order"
            last=$t
        fi
        [ -n "$rest" ] || die "schedule $file:$n: nothing to do at $t"
        case $rest in
            cross\ start\ *|cross\ stop\ *) ;;
            cross*) die "schedule $file:$n: want 'cross start NAME ...' or 'cross stop NAME'";;
            *) local -a w; read -r -a w <<< "$rest"
               live_regions "${w[0]}" > /dev/null
               [ ${#w[@]} -ge 2 ] || die "schedule $file:$n: want REGION key=value..."
               local kv
               for kv in "${w[@]:1}"; do
                   [[ $kv =~ ^(rate|egress|ingress|downlink|delay|jitter|loss|queue)=.+$ ]] ||
                       die "schedule $file:$n: '$kv': want key=value (rate, ingress, delay, jitter, loss, queue)"
               done;;
        esac
        printf '%s\t%s\n' "$t" "$rest"
    done < "$file"
}

# The runner (geoccl-wan _schedule-run): applies the steps in order, each at
# its time after the start or at the next SIGUSR1, whichever comes first
# (@ steps: SIGUSR1 only). Stops when the WAN goes down.
schedule_run() {
    local steps=$1 sd t0 t rest wait_s n=0 go=0 sp
    sd=$(state_dir)
    t0=$EPOCHREALTIME
    trap 'go=1' USR1
    trap 'exit 0' TERM INT HUP
    echo "$(date '+%F %T') schedule started at $t0 (pid $$)"
    while IFS=$'\t' read -r t rest; do
        n=$((n + 1))
        while [ "$go" = 0 ]; do
            [ -f "$sd/config" ] || { echo "WAN '$NAME' went down; schedule stops"; exit 0; }
            if [ "$t" = @ ]; then
                wait_s=1
            else
                wait_s=$(awk -v a="$t0" -v t="$t" -v n="$EPOCHREALTIME" 'BEGIN { w = a + t - n; printf "%.3f", (w > 1 ? 1 : w) }')
                awk -v w="$wait_s" 'BEGIN { exit !(w <= 0) }' && break
            fi
            # In the background, so that SIGUSR1 ends the wait at once.
            sleep "$wait_s" & sp=$!
            wait "$sp"
            kill "$sp" 2>/dev/null
        done
        go=0
        local how=time
        [ "$t" = @ ] && how=signal
        local -a w
        read -r -a w <<< "$rest"
        local at rc
        at=$(awk -v a="$t0" -v n="$EPOCHREALTIME" 'BEGIN { printf "%.3f", n - a }')
        if [ "${w[0]}" = cross ]; then
            # the flows at normal priority, whatever the runner's
            local -a norm=()
            command -v chrt > /dev/null && norm=(chrt -o 0)
            "${norm[@]}" "$SELF" cross "${w[1]}" -n "$NAME" "${w[@]:2}" 9>&-
        else
            "$SELF" set -n "$NAME" -q "${w[@]}" 9>&-
        fi
        rc=$?
        echo "step $n at t=$at s (planned $t, by $how): $rest: status $rc"
    done < "$steps"
    echo "schedule done"
}

do_schedule() {
    local sub=''
    local -a args=()
    while [ $# -gt 0 ]; do
        case $1 in
            -n|--name) NAME=${2:-}; shift 2 || die "-n needs a name";;
            -q|--quiet) QUIET=1; shift;;
            *) if [ -z "$sub" ]; then sub=$1; else args+=("$1"); fi; shift;;
        esac
    done
    live_require_up schedule
    local sd pid
    sd=$(state_dir)
    pid=$(cat "$sd/schedule.pid" 2>/dev/null)
    case $sub in
        next)
            live_running "$pid" || die "schedule next: no schedule runs on '$NAME'"
            kill -USR1 "$pid";;
        stop)
            live_running "$pid" && kill_pids "$pid"
            rm -f "$sd/schedule.pid"
            note "$PROG: schedule on '$NAME' stopped";;
        status)
            if live_running "$pid"; then echo "schedule running, pid $pid"; else echo "no schedule running"; fi
            [ -f "$sd/schedule.log" ] && cat "$sd/schedule.log"
            return 0;;
        _run)
            schedule_run "${args[0]}";;
        *)
            local file=$sub
            [ -n "$file" ] && [ ${#args[@]} -eq 0 ] ||
                die "schedule: usage: $PROG schedule [-n NAME] FILE | next | stop | status"
            ! live_running "$pid" || die "schedule: one already runs on '$NAME' (pid $pid; $PROG schedule stop)"
            schedule_parse "$file" > "$sd/schedule.steps" || exit 1
            [ -s "$sd/schedule.steps" ] || die "schedule: '$file' has no steps"
            : > "$sd/schedule.log"
            # At the delay lines' real-time priority (--rt), as part of the
            # emulated network: on a loaded machine a step woke 1.5 s late
            # at normal priority. It only sleeps between steps.
            local rt
            local -a prio=()
            rt=$(cfg rt)
            [ "${rt:-0}" != 0 ] && command -v chrt > /dev/null && prio=(chrt -f "$rt")
            setsid "${prio[@]}" "$SELF" schedule _run -n "$NAME" "$sd/schedule.steps" \
                < /dev/null >> "$sd/schedule.log" 2>&1 9>&- &
            pid=$!
            echo "$pid" > "$sd/schedule.pid"
            note "$PROG: schedule of $(wc -l < "$sd/schedule.steps") step(s) runs, pid $pid (log $sd/schedule.log; SIGUSR1 or '$PROG schedule next' applies the next step now)";;
    esac
}

# ---- cross traffic -------------------------------------------------------

cross_dir() { echo "$(state_dir)/cross/$1"; }

cross_list() {
    local d n st
    for d in "$(state_dir)"/cross/*/; do
        [ -f "$d/meta" ] || continue
        n=$(basename "$d")
        st=stopped
        live_running "$(cat "$d/client.pid" 2>/dev/null)" && st=running
        echo "cross $n: $(cat "$d/meta") ($st)"
    done
}

do_cross() {
    local sub='' cname='' from='' to='' flows=1 cc=cubic secs='' omit=0 wait_end=0
    while [ $# -gt 0 ]; do
        case $1 in
            --wait) wait_end=1; shift;;
            -n|--name) NAME=${2:-}; shift 2 || die "-n needs a name";;
            --from) from=${2#r}; shift 2 || die "--from needs a region";;
            --to) to=${2#r}; shift 2 || die "--to needs a region";;
            --flows) flows=${2:-}; shift 2 || die "--flows needs a count";;
            --cc) cc=${2:-}; shift 2 || die "--cc needs an algorithm";;
            --seconds) secs=${2:-}; shift 2 || die "--seconds needs a count";;
            --omit) omit=${2:-}; shift 2 || die "--omit needs seconds";;
            -q|--quiet) QUIET=1; shift;;
            -*) die "cross: unknown option '$1'";;
            *) if [ -z "$sub" ]; then sub=$1
               elif [ -z "$cname" ]; then cname=$1
               else die "cross: '$1': one NAME only"; fi
               shift;;
        esac
    done
    case $sub in
        list) live_require_up cross; cross_list; return 0;;
        start|stop|report) ;;
        *) die "cross: usage: $PROG cross start NAME --from A --to B [--flows N] [--cc cubic|bbr] [--seconds S] [--omit S] | stop NAME | report [--wait] NAME | list";;
    esac
    [[ $cname =~ ^[a-zA-Z0-9_-]{1,32}$ ]] || die "cross $sub: want a NAME for the flows (letters, digits, - or _)"
    live_require_up cross
    local d
    d=$(cross_dir "$cname")
    case $sub in
        start) cross_start "$d" "$from" "$to" "$flows" "$cc" "$secs" "$omit";;
        stop) cross_stop "$d";;
        report) [ "$wait_end" = 1 ] && cross_wait "$d"; cross_report "$d";;
    esac
}

cross_start() {
    local d=$1 from=$2 to=$3 flows=$4 cc=$5 secs=$6 omit=$7 regions port t
    command -v iperf3 >/dev/null 2>&1 || die "cross: needs iperf3"
    command -v python3 >/dev/null 2>&1 || die "cross: needs python3 (to read iperf3's JSON)"
    regions=$(cfg regions)
    [[ $from =~ ^[0-9]+$ ]] && [ "$from" -lt "$regions" ] || die "cross start: --from wants a region 0..$((regions - 1))"
    [[ $to =~ ^[0-9]+$ ]] && [ "$to" -lt "$regions" ] && [ "$to" != "$from" ] ||
        die "cross start: --to wants a region 0..$((regions - 1)) other than --from"
    [[ $flows =~ ^[1-9][0-9]?$ ]] || die "cross start: --flows wants 1..99"
    [ -z "$secs" ] || [[ $secs =~ ^[1-9][0-9]*$ ]] || die "cross start: --seconds wants a whole number >= 1"
    [[ $omit =~ ^[0-9]+$ ]] || die "cross start: --omit wants whole seconds"
    grep -qw -- "$cc" /proc/sys/net/ipv4/tcp_available_congestion_control 2>/dev/null ||
        die "cross start: --cc $cc: not available; this kernel has: $(cat /proc/sys/net/ipv4/tcp_available_congestion_control 2>/dev/null)"
    [ -e "$d/client.pid" ] && live_running "$(cat "$d/client.pid")" &&
        die "cross start: '$(basename "$d")' already runs ($PROG cross stop $(basename "$d"))"
    lock_state
    # A namespace may only pick a congestion control the root allows.
    local allowed
    allowed=$(sysctl -n net.ipv4.tcp_allowed_congestion_control 2>/dev/null)
    [[ " $allowed " == *" $cc "* ]] || set_root_sysctl net.ipv4.tcp_allowed_congestion_control "$allowed $cc"
    port=$(( $(cat "$(state_dir)/cross.port" 2>/dev/null || echo $((LIVE_CROSS_PORT - 1))) + 1 ))
    echo "$port" > "$(state_dir)/cross.port"
    exec 9>&-
    rm -rf "$d" && mkdir -p "$d" || die "cannot create $d"
    local a_from a_to
    a_from=$(cfg "addr_$from") a_to=$(cfg "addr_$to")
    echo "r$from->r$to $flows x $cc${secs:+, $secs s}$([ "$omit" = 0 ] || echo " after $omit s omitted"), port $port" > "$d/meta"
    [ -n "$secs" ] && echo $((secs + omit)) > "$d/seconds"
    setsid ip netns exec "$(ns_of "$to")" iperf3 -s -1 -B "$a_to" -p "$port" -J \
        < /dev/null > "$d/server.json" 2> "$d/server.err" 9>&- &
    echo $! > "$d/server.pid"
    for ((t = 0; t < 100; t++)); do
        ip netns exec "$(ns_of "$to")" ss -Htln "sport = :$port" 2>/dev/null | grep -q . && break
        sleep 0.02
    done
    # -J: iperf3 prints its JSON at the end, also when stopped by SIGINT.
    setsid ip netns exec "$(ns_of "$from")" iperf3 -c "$a_to" -B "$a_from" -p "$port" -P "$flows" \
        -C "$cc" -t "${secs:-86400}" -O "$omit" -J < /dev/null > "$d/client.json" 2> "$d/client.err" 9>&- &
    echo $! > "$d/client.pid"
    live_log "cross start $(basename "$d") $(cat "$d/meta")"
    note "$PROG: cross traffic '$(basename "$d")' runs: $(cat "$d/meta") (pid $(cat "$d/client.pid"))"
}

# report --wait: until flows with --seconds have ended (their time and 10 s
# more at most); flows without --seconds are not waited for.
cross_wait() {
    local d=$1 pid secs t
    secs=$(cat "$d/seconds" 2>/dev/null) || return 0
    pid=$(cat "$d/client.pid" 2>/dev/null)
    for ((t = 0; t < (secs + 10) * 20; t++)); do live_running "$pid" || return 0; sleep 0.05; done
}

cross_stop() {
    local d=$1 pid t
    [ -f "$d/meta" ] || die "cross stop: no cross traffic '$(basename "$d")' on '$NAME'"
    pid=$(cat "$d/client.pid" 2>/dev/null)
    if live_running "$pid"; then
        # SIGINT: iperf3 ends the test and prints what it measured so far;
        # the server, told so, prints what it received.
        kill -INT "$pid" 2>/dev/null
        for ((t = 0; t < 100; t++)); do live_running "$pid" || break; sleep 0.05; done
        live_running "$pid" && kill_pids "$pid"
    fi
    pid=$(cat "$d/server.pid" 2>/dev/null)
    for ((t = 0; t < 40; t++)); do live_running "$pid" || break; sleep 0.05; done
    live_running "$pid" && kill_pids "$pid"
    live_log "cross stop $(basename "$d")"
    cross_report "$d"
}

# Mbit/s per flow and in total, from iperf3's JSON: the receiver's figures
# (the client's at a normal end, else the server's intervals after a stop),
# the sender's intervals only where neither has them.
cross_report() {
    local d=$1 pid
    [ -f "$d/meta" ] || die "cross report: no cross traffic '$(basename "$d")' on '$NAME'"
    pid=$(cat "$d/client.pid" 2>/dev/null)
    if live_running "$pid"; then
        echo "cross $(basename "$d"): $(cat "$d/meta"): still running; its figures come at its end or at cross stop"
        return 0
    fi
    python3 - "$d" "$(basename "$d")" "$(cat "$d/meta")" <<'EOF'
import json, sys
d, name, meta = sys.argv[1:4]

def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}

def from_intervals(j):
    """Per-stream Mbit/s over the intervals not omitted, and their seconds."""
    ivs = [iv for iv in j.get("intervals", []) if not iv["sum"].get("omitted")]
    if not ivs:
        return [], 0.0
    secs = sum(iv["sum"]["seconds"] for iv in ivs)
    per = [0.0] * len(ivs[0]["streams"])
    for iv in ivs:
        for k, s in enumerate(iv["streams"][:len(per)]):
            per[k] += s["bytes"] * 8 / 1e6
    return [b / secs if secs else 0.0 for b in per], secs

client, server = load(d + "/client.json"), load(d + "/server.json")
end = client.get("end", {})
if end.get("sum_received", {}).get("bytes"):
    per = [s["receiver"]["bits_per_second"] / 1e6 for s in end.get("streams", [])]
    secs, side = end["sum_received"]["seconds"], "receiver"
else:
    per, secs = from_intervals(server)
    side = "receiver, intervals"
    if not per:
        per, secs = from_intervals(client)
        side = "sender, intervals"
if not per:
    print(f"cross {name}: {meta}: no figures ({d}/client.json, server.json)")
    sys.exit(1)
err = client.get("error", "")
print(f"cross {name}: {meta}: total {sum(per):.2f} Mbit/s over {secs:.1f} s ({side}); per flow "
      + " ".join(f"{x:.2f}" for x in per) + " Mbit/s" + (f"; iperf3: {err}" if err else ""))
EOF
}
