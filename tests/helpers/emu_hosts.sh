# shellcheck shell=bash
# Sourced by tests that run a launcher across machines: network namespaces
# stand in for the machines.  Each host H is the namespace gh-H, with
# loopback and one veth (eth0) to the bridge gh-br in the root namespace;
# host I (from 0) has 10.233.47.(11+I)/24, the bridge 10.233.47.1.  The
# hosts reach each other by name (ip netns exec binds /etc/netns/gh-H/hosts
# over /etc/hosts), and `on` gives each program a UTS namespace with H as
# its host name, so that a launcher sees six machines with six names.
# Neither these names nor this subnet are tools/geoccl-wan's (its
# namespaces are NAME-rI, its subnet 10.231.0.0/24), so the two can be up
# at once; the tests still take wan_lock (tests/helpers/wan_common.sh).
#
# hosts_up H...   creates the hosts (their names must start with a letter)
# hosts_down      removes every gh-* namespace, the bridge and the files
# on H CMD...     runs CMD on host H, as ssh H would

EMU_PREFIX=gh-
EMU_BRIDGE=gh-br
EMU_SUBNET=10.233.47
EMU_HOSTS=()

emu_addr() {
    local i
    for i in "${!EMU_HOSTS[@]}"; do
        [ "${EMU_HOSTS[$i]}" = "$1" ] && { echo "$EMU_SUBNET.$((11 + i))"; return 0; }
    done
    return 1
}

hosts_up() {
    local h i=0 ns
    EMU_HOSTS=("$@")
    ip link add "$EMU_BRIDGE" type bridge || return 1
    ip addr add "$EMU_SUBNET.1/24" dev "$EMU_BRIDGE" &&
        ip link set "$EMU_BRIDGE" up || return 1
    for h in "$@"; do
        ns=$EMU_PREFIX$h
        ip netns add "$ns" &&
            ip link add "gh-v$i" type veth peer name eth0 netns "$ns" &&
            ip link set "gh-v$i" master "$EMU_BRIDGE" &&
            ip link set "gh-v$i" up &&
            ip -n "$ns" link set lo up &&
            ip -n "$ns" addr add "$EMU_SUBNET.$((11 + i))/24" dev eth0 &&
            ip -n "$ns" link set eth0 up || return 1
        i=$((i + 1))
    done
    for h in "$@"; do
        mkdir -p "/etc/netns/$EMU_PREFIX$h" || return 1
        {
            echo "127.0.0.1 localhost"
            i=0
            for o in "$@"; do echo "$EMU_SUBNET.$((11 + i)) $o"; i=$((i + 1)); done
        } > "/etc/netns/$EMU_PREFIX$h/hosts"
    done
}

# Ends what runs in the hosts (the launchers' daemons too), then removes
# them; safe to call twice and when nothing is up.
hosts_down() {
    local ns
    for ns in $(ip netns list 2>/dev/null | awk -v p="$EMU_PREFIX" 'index($1, p) == 1 { print $1 }'); do
        # shellcheck disable=SC2046
        kill -9 $(ip netns pids "$ns" 2>/dev/null) 2>/dev/null
        ip netns del "$ns" 2>/dev/null
        rm -rf "/etc/netns/$ns"
    done
    ip link del "$EMU_BRIDGE" 2>/dev/null
    return 0
}

on() {
    local h=$1
    shift
    # shellcheck disable=SC2016  # expanded by that sh
    ip netns exec "$EMU_PREFIX$h" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$h" "$@"
}
