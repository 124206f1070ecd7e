#!/usr/bin/env bash
# Build and test libs/native with the system C compiler (no downloads).
#
#   libs/native/build.sh lib    build build/libmcp_mempool.so and mcp_native/_frontdoor*.so, the router's
#                               grpc++ front door, for $PYTHON (default python3) (what `make native` runs;
#                               the default); each only when a source, the script or the compiler command
#                               changed since its last build (a .stamp beside it keeps the command). The front door needs Debian's libgrpc++-dev and
#                               python3-dev (tools/install-system-deps.sh grpc)
#   libs/native/build.sh pool   build build/libmcp_mempool.so alone (when it is not current)
#   libs/native/build.sh test   build the library, then the C tests twice and run them:
#                                 1. with -fsanitize=address,undefined (any report fails the run)
#                                 2. plain, under valgrind --leak-check=full (skipped, with a message,
#                                    only when valgrind is not installed)
#   libs/native/build.sh clean  remove build/
#
# Exits non-zero on any compile error, test failure, sanitizer or valgrind report.
# Outputs are written to a temporary name and renamed, so a process loading the .so never sees half a file.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BUILD="$HERE/build"
CC="${CC:-cc}"
CXX="${CXX:-c++}"
CFLAGS_COMMON=(-std=c11 -O2 -g -Wall -Wextra -Werror -pthread -I"$HERE/include")
SRC="$HERE/src/mempool.c"
FRONTDOOR_SRC=("$HERE/src/reactor.cc" "$HERE/src/convert.cc" "$HERE/src/server.cc" "$HERE/src/pytype.cc")
TEST_SRC="$HERE/tests/test_mempool.c"

# current OUTPUT STAMP_TEXT INPUTS...: true when OUTPUT exists, is newer than every input and was built with
# the same compiler command (STAMP_TEXT, kept beside it), so `make native` (run by make up and make test) only
# compiles what changed.
current() {
    local out="$1" stamp="$2"
    shift 2
    [ -f "$out" ] && [ -f "$out.stamp" ] && [ "$(cat "$out.stamp")" = "$stamp" ] || return 1
    local f
    for f in "$@"; do
        [ "$f" -nt "$out" ] && return 1
    done
    return 0
}

build_lib() {
    mkdir -p "$BUILD"
    local out="$BUILD/libmcp_mempool.so"
    local stamp="$CC ${CFLAGS_COMMON[*]} -fPIC -shared"
    if [ "${1:-}" != force ] && current "$out" "$stamp" "$SRC" "$HERE/include/mcp_mempool.h" "$HERE/build.sh"; then
        echo "up to date: $out"
        return 0
    fi
    local tmp
    tmp="$(mktemp "$BUILD/.libmcp_mempool.so.XXXXXX")"
    "$CC" "${CFLAGS_COMMON[@]}" -fPIC -shared -o "$tmp" "$SRC" || { rm -f "$tmp"; return 1; }
    chmod 755 "$tmp" # mktemp made it 0600: a library others (a container's service user) load
    mv -f "$tmp" "$out"
    echo "$stamp" >"$out.stamp"
    echo "built $out"
}

build_frontdoor() {
    local python="${PYTHON:-python3}"
    local suffix includes out tmp
    suffix="$("$python" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')"
    includes="$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
    out="$HERE/mcp_native/_frontdoor$suffix"
    # hidden visibility and the version script: the module exports PyInit__frontdoor alone, so the
    # grpcio wheel's grpc core in the same process never binds to it (tests/integration/test_grpc_cores.py)
    local cxxflags=(-std=c++17 -O2 -g -Wall -Wextra -Werror -Wno-missing-field-initializers -fPIC
        -fvisibility=hidden -fvisibility-inlines-hidden -I"$includes")
    # grpc++'s pkg-config file stands for its version (an upgrade rewrites it); pkg-config itself takes
    # about a second a call here (abseil's many .pc files), so it runs only when a build is due
    local stamp="$CXX ${cxxflags[*]}" pcfiles=()
    mapfile -t pcfiles < <(compgen -G "/usr/lib/*/pkgconfig/grpc++.pc"; compgen -G "/usr/local/lib/pkgconfig/grpc++.pc")
    if [ "${1:-}" != force ] && current "$out" "$stamp" "${FRONTDOOR_SRC[@]}" "$HERE/src/frontdoor.h" \
        "$HERE/src/frontdoor.map" "$HERE/build.sh" "${pcfiles[@]}"; then
        echo "up to date: $out"
        return 0
    fi
    local grpc_cflags grpc_libs
    grpc_cflags="$(pkg-config --cflags grpc++)"
    grpc_libs="$(pkg-config --libs grpc++)"
    # each translation unit parses grpc++'s headers: compile them side by side, then link
    local objdir pids=() src
    objdir="$(mktemp -d "$BUILD/.frontdoor.XXXXXX")"
    for src in "${FRONTDOOR_SRC[@]}"; do
        # shellcheck disable=SC2086  # pkg-config's flags are words
        "$CXX" "${cxxflags[@]}" $grpc_cflags -c -o "$objdir/$(basename "$src" .cc).o" "$src" &
        pids+=($!)
    done
    local failed=0 pid
    for pid in "${pids[@]}"; do
        wait "$pid" || failed=1
    done
    tmp="$(mktemp "$HERE/mcp_native/._frontdoor.XXXXXX")"
    # shellcheck disable=SC2086
    if [ "$failed" = 1 ] || ! "$CXX" -shared -Wl,--version-script="$HERE/src/frontdoor.map" -o "$tmp" \
        "$objdir"/*.o $grpc_libs; then
        rm -rf "$tmp" "$objdir" # a failed build leaves no temporary file behind
        return 1
    fi
    rm -rf "$objdir"
    chmod 755 "$tmp"
    mv -f "$tmp" "$out"
    echo "$stamp" >"$out.stamp"
    echo "built $out"
}

build_test() { # build_test OUTPUT EXTRA_FLAGS...
    local out="$1"
    shift
    "$CC" "${CFLAGS_COMMON[@]}" "$@" -o "$out.tmp" "$SRC" "$TEST_SRC"
    mv -f "$out.tmp" "$out"
}

run_tests() {
    build_lib force
    echo "== C tests with AddressSanitizer + UndefinedBehaviorSanitizer"
    build_test "$BUILD/test_mempool_asan" -fsanitize=address,undefined -fno-sanitize-recover=all \
        -fno-omit-frame-pointer
    ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:abort_on_error=0" \
        UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1" \
        "$BUILD/test_mempool_asan"
    echo "asan: ok"

    echo "== C tests under valgrind"
    build_test "$BUILD/test_mempool"
    if command -v valgrind >/dev/null 2>&1; then
        valgrind --quiet --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite,indirect \
            "$BUILD/test_mempool"
        echo "valgrind: ok"
    else
        echo "valgrind: SKIPPED (valgrind is not installed; apt-get install valgrind to run this check)"
        "$BUILD/test_mempool"
    fi
}

case "${1:-lib}" in
    lib)
        build_lib
        build_frontdoor
        ;;
    pool) build_lib ;;
    test) run_tests ;;
    clean) rm -rf "$BUILD" "$HERE"/mcp_native/_frontdoor*.so "$HERE"/mcp_native/_frontdoor*.so.stamp ;;
    *)
        echo "usage: $0 [lib|pool|test|clean]" >&2
        exit 2
        ;;
esac
