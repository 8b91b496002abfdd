#!/usr/bin/env bash
#
# The suite under the sanitizers, each in a build of its own:
#
#   bash tests/run-sanitizers.sh [MODE...]      (from a configured source tree)
#
# MODE is address,undefined (the suite but for the tests over emulated
# regions that only repeat, slowly, paths the others cover: see
# asan_skip) or thread (the tests whose threads share state: transport,
# shared-memory rings, collectives, hierarchical, bootstrap, device
# emulation); default both.  The distributed sources (make distdir) are
# copied to a work folder once; each mode builds them in a folder of its
# own with ./configure --enable-sanitizers=MODE, runs its tests and prints
# "MODE: N passed, N failed, N skipped (S s)".  The modes run at the same
# time (GEOCCL_SANITIZE_SERIAL=1: one after the other).  A sanitizer report
# fails its test (the runtimes stop the program with exit status 66).  The
# exit status is 0 only when no test of any mode failed.
#
# Environment: GEOCCL_SANITIZE_DIR, the work folder (default: a new one in
# /tmp, removed afterwards unless a test failed); GEOCCL_DISTDIR, sources
# already copied by make distdir (tests/run-all.sh makes one copy for this
# and tests/run-cross.sh), used as they are instead of a copy of its own.
#
set -uo pipefail

cd "$(dirname "$0")/.." || exit 1
[ -n "${GEOCCL_DISTDIR:-}" ] || [ -f Makefile ] ||
    { echo "run-sanitizers: configure the source tree first"; exit 1; }

modes=("$@")
[ ${#modes[@]} -eq 0 ] && modes=(address,undefined thread)

# The tests whose threads share state with the progress threads; thread
# sanitizer runs take about 5-15x longer, so only these run under it, and
# only the library and their programs are built (thread_programs;
# run_dev_emu.sh runs dev_allreduce-emu on libnccl_emu), without the tools,
# the examples and the torch extension
# (--without-python: its C++ is most of a build's compile time, and
# run_torch.sh is not among them).
# Slowest first (make -j2 starts them in this order; under thread, beside
# other work on two cores, they took about 180, 105, 110 and 75 s, the rest
# under 45 s; their CPU time 63, 77, 29 and 22 s).
thread_tests="tests/test_collectives tests/test_hier tests/test_peer_death \
tests/device/run_dev_emu.sh tests/unit/test_transport tests/unit/test_bootstrap tests/unit/test_shm_ring \
tests/test_lazy_connect"
thread_programs="$(printf '%s\n' $thread_tests | grep -v '\.sh$' | tr '\n' ' ')tests/device/dev_allreduce-emu"

# Left out under address,undefined: the probe over emulated regions (about
# 6 minutes of namespaces, shaping and delays; the probe's code runs in
# test_hier and test_bootstrap too), the hierarchical all-reduce over
# emulated links (the same collective code as test_hier and
# test_compress_hier, with the WAN's delays), and the emulator's own smoke
# test (57 s, none of it the library's code: its delay line is built with
# plain cc, not this build's flags) and its test of changes under running
# traffic (test_wan_schedule, 45 s, none of it the library's either), and
# the faults between emulated
# regions (its limits are wall-clock ones: a rank must fail within 2 s of a
# peer's death; test_resume and test_peer_death run the same transport
# code under the sanitizers), the plan following a changing link (its
# calls take seconds each on purpose; test_hier runs the same collective
# code), the elastic regions (a lease of a few seconds decides who is dead:
# instrumented ranks renewing late would be counted dead; test_shrink runs
# the same shrink under the sanitizers), and the pip install of the Python package
# (pip builds it anew, without this build's flags: nothing of it would be
# instrumented), and the multi-host recipes (launchers starting the same
# collectives that the tests beside them check under the sanitizers, in
# interpreters and daemons that are not instrumented; so does the elastic
# DiLoCo, test_elastic_torch), and the device
# bundle (bundle.sh builds its own library with the bundle's flags, never
# this build's; run_dev_emu runs the same device code instrumented). All
# eleven run in the plain build.
# run_wan_security still runs: the encrypted frames and the emulated WAN's
# bootstrap under the sanitizers.
asan_skip="tests/wan/test_probe_wan.sh tests/wan/test_hier_wan.sh tests/wan/test_wan_smoke.sh \
tests/wan/test_wan_schedule.sh tests/wan/test_faults.sh tests/wan/test_replan.sh \
tests/wan/test_elastic.sh tests/torch/run_pip_install.sh tests/wan/test_recipes.sh tests/device/run_bundle_emu.sh \
tests/wan/test_elastic_torch.sh"
# Started first under address,undefined, the slowest there (beside other
# work on two cores about 165, 70, 50 and 40 s), so that the two jobs of
# make -j2 end close together.
asan_first="tests/device/run_dev_emu.sh tests/device/codec_emu tests/torch/run_torch.sh \
tests/test_hier"

work=${GEOCCL_SANITIZE_DIR:-$(mktemp -d /tmp/geoccl-sanitize.XXXXXX)}
mkdir -p "$work"
if [ -n "${GEOCCL_DISTDIR:-}" ]; then
    src=$(cd "$GEOCCL_DISTDIR" && pwd) || exit 1
else
    src="$work/src"
    rm -rf "$src"
    if ! make -s distdir distdir="$src" > "$work/distdir.log" 2>&1; then
        cat "$work/distdir.log"
        echo "run-sanitizers: make distdir failed"
        exit 1
    fi
fi

# The source tree this runs from: tests/run-all.sh builds there (in place)
# before this starts.
top=$(pwd)

# mkvar DIR TEXT: TEXT (make variables) as the Makefile in DIR expands it.
mkvar() {
    printf 'p:\n\t@echo %s\n' "$2" | make -s -C "$1" -f Makefile -f - p 2>/dev/null
}

# torch_cxx DIR: the command that compiles the torch extension's objects
# in the build in DIR, with its source folder named SRC.
torch_cxx() {
    local cmd t
    cmd=$(mkvar "$1" '$(CXX) $(GEOCCL_TORCH_CXXFLAGS)')
    t=$(mkvar "$1" '$(top_srcdir)')
    echo "${cmd//"-I$t/"/-ISRC/}"
}

# reuse_torch_objects PLAIN BUILD: the torch extension's objects
# (geoccl/csrc/) of the build in PLAIN, copied into BUILD, when PLAIN has
# them up to date and BUILD would compile them from the same sources with
# the same command.  They are never instrumented (the extension is compiled
# with GEOCCL_TORCH_CXXFLAGS, without the sanitizer flags: it runs in an
# interpreter that is not), so compiling them again, some 90 CPU seconds,
# would make the same objects.  Anything different: BUILD compiles them.
reuse_torch_objects() {
    local plain=$1 b=$2 objs o f psrc cmd
    [ -f "$plain/Makefile" ] || return 0
    objs=$(mkvar "$b" '$(geoccl_torch_objects)')
    [ -n "$objs" ] || return 0
    for o in $objs; do
        [ -f "$plain/$o" ] && make -s -C "$plain" -q "$o" 2>/dev/null || return 0
    done
    psrc=$(mkvar "$plain" '$(abs_top_srcdir)')
    [ -d "$psrc/geoccl/csrc" ] || return 0
    for f in "$psrc"/geoccl/csrc/*.[ch]pp include/nccl.h include/geoccl.h; do
        f=${f#"$psrc"/}
        cmp -s "$psrc/$f" "$src/$f" || return 0
    done
    cmd=$(torch_cxx "$plain")
    [ -n "$cmd" ] && [ "$cmd" = "$(torch_cxx "$b")" ] || return 0
    mkdir -p "$b/geoccl/csrc"
    for o in $objs; do
        cp "$plain/$o" "$b/$o" && touch "$b/$o" || { rm -f "$b/$o"; return 0; }
    done
    echo "== sanitizers: the torch extension's objects (not instrumented) from the build in $plain"
}

# run_mode MODE: configure, build and test MODE in $work/build-MODE; what
# it prints goes to stdout, its summary line to build-MODE/summary and its
# number of failures to build-MODE/failed.
run_mode() {
    local mode=$1 t0 b extra only gencode tests late what all t trs result wall log pass skip f1 e1 x1 fail l secs skipped
    t0=$(date +%s)
    b="$work/build-${mode//,/-}"
    rm -rf "$b"
    mkdir -p "$b"
    echo "== sanitizers $mode: configure and build in $b"
    extra=()
    case $mode in *thread*) extra=(--without-python) ;; esac
    if ! (cd "$b" && "$src/configure" --enable-sanitizers="$mode" "${extra[@]}" > configure.log 2>&1); then
        tail -n 30 "$b/configure.log"
        echo "$mode: configure failed" > "$b/summary"
        echo 1 > "$b/failed"
        return
    fi
    # What the tests run: under thread only the library and the threaded
    # tests' programs (no tools, examples or other tests).
    only=()
    case $mode in
        *thread*) only=(check_PROGRAMS="$thread_programs" bin_PROGRAMS= noinst_PROGRAMS=) ;;
    esac
    # The kernels as PTX of the last architecture only (the last -gencode
    # configure chose and proved): no test here runs them on a GPU, nvcc
    # is not instrumented, and the plain build compiles every
    # architecture's machine code; this halves nvcc's time.
    gencode=$(sed -n 's/^NVCC_GENCODE = .*\(-gencode=[^ ]*\) *$/\1/p' "$b/Makefile")
    [ -n "$gencode" ] && only+=(NVCC_GENCODE="$gencode")
    reuse_torch_objects "$top" "$b"
    if ! make -C "$b" -j2 check TESTS= "${only[@]}" > "$b/make.log" 2>&1; then
        grep -E 'error|Error' "$b/make.log" | head -n 30
        echo "$mode: build failed" > "$b/summary"
        echo 1 > "$b/failed"
        return
    fi
    tests='' late='' what=''
    case $mode in
        *thread*)
            tests=$thread_tests what="the threaded tests"
            ;;
        *)
            # The build's own list (make's TESTS), less asan_skip.
            all=$(printf 'print-tests:\n\t@echo $(TESTS)\n' |
                  make -s -C "$b" -f Makefile -f - print-tests 2>/dev/null)
            for t in $asan_first; do
                case " $all " in *" $t "*) tests="$tests $t" ;; esac
            done
            for t in $all; do
                case " $asan_skip $asan_first " in *" $t "*) continue ;; esac
                case $t in tests/wan/*) late="$late $t" ;; *) tests="$tests $t" ;; esac
            done
            # The emulated-WAN tests last: they wait for one another
            # (tests/helpers/wan_common.sh, wan_lock), also for those of a
            # plain build's make check beside this, and should not hold a
            # job while they wait.
            tests="$tests$late"
            tests=${tests# } what="all but $asan_skip"
            ;;
    esac
    echo "== sanitizers $mode: make check${tests:+ TESTS=($what)}"
    if [ -n "$tests" ]; then
        # With the other emulated-WAN tests left out, run_wan_security waits
        # for none of them (Makefile.am, "test ordering"): it checks what
        # crosses, not how fast.
        make -C "$b" -j2 check TESTS="$tests" "${only[@]}" \
            geoccl_wan_security_after= > "$b/check.log" 2>&1
    else
        make -C "$b" -j2 check > "$b/check.log" 2>&1
    fi
    # Each test's result and wall time (tests/helpers/timed.sh), slowest first.
    for trs in "$b"/tests/*.trs "$b"/tests/*/*.trs; do
        [ -f "$trs" ] || continue
        result=$(sed -n 's/^:test-result: *//p' "$trs" | head -n 1)
        # "12.3 s (cpu 4.1 s)" -> "12.3 s, cpu 4.1 s"
        wall=$(sed -n 's/^geoccl-test-wall: \([0-9.]* s\)\( (\(cpu [0-9.]* s\))\)\{0,1\}$/\1, \3/p' \
                   "${trs%.trs}.log" | tail -n 1)
        wall=${wall%, }
        printf '  %s: %s (%s)\n' "${result:-?}" "${trs#"$b"/}" "${wall:-?}"
    done | sed 's/\.trs (/ (/' | sort -t'(' -k2 -n -r
    log="$b/test-suite.log"
    count() { sed -n "s/^# $1: *\\([0-9][0-9]*\\).*/\\1/p" "$log" 2>/dev/null | head -n 1; }
    pass=$(count PASS); skip=$(count SKIP)
    f1=$(count FAIL); e1=$(count ERROR); x1=$(count XPASS)
    fail=$(( ${f1:-0} + ${e1:-0} + ${x1:-0} ))
    [ -f "$log" ] || fail=1
    if [ "$fail" -ne 0 ]; then
        # What the failing tests printed: sanitizer reports and test output.
        for l in $(grep -l -E '^(FAIL|ERROR)' "$b"/tests/*.log "$b"/tests/*/*.log 2>/dev/null | grep -v test-suite); do
            echo "--- $l"
            grep -E -A25 'ERROR: (Address|Leak|Thread)Sanitizer|WARNING: ThreadSanitizer|runtime error|SUMMARY' "$l" | head -n 80
            tail -n 15 "$l"
        done
    fi
    secs=$(( $(date +%s) - t0 ))
    skipped=$(grep -h '^SKIP' "$b"/tests/*.log "$b"/tests/*/*.log 2>/dev/null | head -n 5)
    {
        echo "$mode: ${pass:-0} passed, $fail failed, ${skip:-0} skipped (${secs} s)"
        [ -n "$skipped" ] && echo "$skipped"
    } > "$b/summary"
    echo "$fail" > "$b/failed"
}

# The modes at once: most of a mode's time is spent waiting (timeouts,
# ranks that wait for one another, single-threaded emulation), so two
# builds side by side take little longer than the slower one alone.  Each
# prints when it is done, in the order asked.  GEOCCL_SANITIZE_SERIAL=1:
# one after the other, printing as they go.
if [ ${#modes[@]} -gt 1 ] && [ "${GEOCCL_SANITIZE_SERIAL:-0}" = 0 ]; then
    pids=()
    for mode in "${modes[@]}"; do
        run_mode "$mode" > "$work/${mode//,/-}.out" 2>&1 &
        pids+=($!)
    done
    for i in "${!modes[@]}"; do
        wait "${pids[$i]}"
        cat "$work/${modes[$i]//,/-}.out"
    done
else
    for mode in "${modes[@]}"; do run_mode "$mode"; done
fi

total_fail=0
summary=()
for mode in "${modes[@]}"; do
    b="$work/build-${mode//,/-}"
    [ -f "$b/summary" ] || echo "$mode: did not finish" > "$b/summary"
    while IFS= read -r l; do summary+=("$l"); done < "$b/summary"
    total_fail=$((total_fail + $(cat "$b/failed" 2>/dev/null || echo 1)))
done

echo "== sanitizers: summary"
printf '  %s\n' "${summary[@]}"
if [ "$total_fail" -eq 0 ] && [ -z "${GEOCCL_SANITIZE_DIR:-}" ]; then
    chmod -R u+w "$work" 2>/dev/null
    rm -rf "$work"
else
    echo "  builds and logs kept in $work"
fi
[ "$total_fail" -eq 0 ]
