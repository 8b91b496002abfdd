#!/usr/bin/env bash
#
# The library's layers, bottom to top, and the rule that keeps them layers:
# a file may include headers of its own layer and of layers below it, never
# of one above.  Public headers (include/) and config.h are for everyone.
#
#   bash tests/test_layers.sh [SRCDIR]
#
# Also checks that no source folder holds more than 16 C/CUDA files and no
# library source more than 1,000 lines, so that a folder and a file stay
# things a newcomer reads in one sitting, and that no library source
# carries a date (history lives in git).
#
# Exit status 0 when the tree keeps both rules; 1 with every offending
# include (file:line, both layers) otherwise.
#
set -uo pipefail

src=${1:-${srcdir:-$(dirname "$0")/..}}
cd "$src" || exit 1

# Bottom first.  The arrows the order encodes: API -> device path ->
# collectives -> the communicator's state -> topology (its probe measures
# over the transports) and compress/cuda -> bootstrap -> transports -> base.
# comm/elastic (membership in a store, growing and shrinking) sits between
# the API and the device path: it makes communicators as the API does.
# cuda/ sits above compress/: the kernels implement the codecs' formats
# (compress/codec.h) and the device path calls them.
layers=(
    comm/base
    comm/transport
    comm/bootstrap
    compress
    cuda
    topology
    comm/core
    comm/coll
    comm/device
    comm/elastic
    comm/api
)

rank_of() {
    local path=$1 i
    for i in "${!layers[@]}"; do
        case $path in
            "${layers[$i]}"/*) echo "$i"; return ;;
        esac
    done
    echo -1
}

bad=0
files=0
for layer in "${layers[@]}"; do
    [ -d "$layer" ] || { echo "layer folder $layer is missing"; bad=1; continue; }
    for f in "$layer"/*.c "$layer"/*.h "$layer"/*.cu; do
        [ -f "$f" ] || continue
        files=$((files + 1))
        mine=$(rank_of "$f")
        while IFS=: read -r line inc; do
            # Resolve as the compiler does: from the source tree's top
            # (-I$(top_srcdir)), then beside the file.  What resolves to
            # neither is outside the library (system, toolkit, test
            # emulation) and not a layer's business.
            if [ -f "$inc" ]; then target=$inc
            elif [ -f "$(dirname "$f")/$inc" ]; then target=$(dirname "$f")/$inc
            else continue
            fi
            theirs=$(rank_of "$target")
            [ "$theirs" -lt 0 ] && continue
            if [ "$theirs" -gt "$mine" ]; then
                echo "$f:$line: includes $target: layer ${layers[$theirs]} is above ${layers[$mine]}"
                bad=1
            fi
        done < <(awk '/^[ \t]*#[ \t]*include[ \t]*"/ {
                          split($0, q, "\""); print FNR ":" q[2] }' "$f")
    done
done

# Folders of sources (library, tools/, examples, tests): at most 16 C/CUDA
# files each.
while read -r dir; do
    n=$(find "$dir" -maxdepth 1 -type f \( -name '*.c' -o -name '*.cu' \) | wc -l)
    if [ "$n" -gt 16 ]; then
        echo "$dir holds $n C/CUDA files (at most 16)"
        bad=1
    fi
done < <(find comm compress cuda topology tools examples tests -type d -not -path '*/.*' \
              -not -name '.libs' -not -name '.deps' 2>/dev/null)

# Library sources a newcomer reads in one sitting: at most 1,000 lines each.
while read -r f; do
    n=$(wc -l < "$f")
    if [ "$n" -gt 1000 ]; then
        echo "$f has $n lines (at most 1000: split it at its seams)"
        bad=1
    fi
done < <(find comm compress topology cuda geoccl include -type f \
              \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cpp' -o -name '*.hpp' \
                 -o -name '*.py' \) -not -path '*/.*' 2>/dev/null)

# Library comments state rules and reasons; history (dates of runs, as
# 2026-01-31) lives in git and on the results page, not in the code.
if dates=$(grep -rnE '20[0-9]{2}-[01][0-9]-[0-3][0-9]' comm compress topology cuda geoccl include \
               --include='*.c' --include='*.h' --include='*.cu' --include='*.cpp' \
               --include='*.hpp' --include='*.py' 2>/dev/null); then
    echo "$dates" | sed 's/$/  <- a date in a library source/'
    bad=1
fi

if [ "$files" -eq 0 ]; then
    echo "no source files found under $src"
    exit 1
fi
if [ "$bad" -ne 0 ]; then
    echo "FAIL: the layers are not kept (see above)"
    exit 1
fi
echo "PASS: $files files in ${#layers[@]} layers, no include upward, no folder over 16 C/CUDA files,"
echo "      no library source over 1,000 lines or with a date"
