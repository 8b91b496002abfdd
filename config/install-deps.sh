#!/usr/bin/env bash
#
# Installs GeoCCL's build and test dependencies that are missing, when run
# as root on a system with apt-get (Debian 12). Quiet when all are present;
# as another user, or without apt-get, it does nothing.
#
# slurmd, slurmctld and slurm-client run the Slurm recipe of
# tests/wan/test_recipes.sh (docs/multi-host.md); etcd-server (and
# etcd-client's etcdctl, to look at the records) the membership store of
# tests/wan/test_elastic.sh (docs/elastic.md).
# libssl-dev:arm64 (multiarch) is the aarch64 cross build's libcrypto
# (tests/run-cross.sh); the arm64 architecture is added to dpkg for it.
packages=(build-essential autoconf automake libtool pkg-config libssl-dev libzstd-dev
          libibverbs-dev libopenmpi-dev openmpi-bin libcunit1-dev iproute2 tcpdump python3-sklearn zlib1g-dev
          python3-torch libtorch-dev python3-pytest python3-venv python3-pip python3-setuptools python3-wheel
          slurmd slurmctld slurm-client etcd-server etcd-client
          gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user libssl-dev:arm64)

[ "$(id -u)" = 0 ] || exit 0
command -v apt-get >/dev/null 2>&1 || exit 0
command -v dpkg-query >/dev/null 2>&1 || exit 0
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
        missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
case " ${missing[*]} " in
    *:arm64\ *) dpkg --print-foreign-architectures | grep -qx arm64 || dpkg --add-architecture arm64;;
esac
echo "== installing ${missing[*]}"
apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
