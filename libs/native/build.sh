#!/usr/bin/env bash
# Build and test libs/native with the system C compiler (no downloads).
#
#   libs/native/build.sh lib    build build/libmcp_mempool.so and mcp_native/_frontdoor*.so, the router's
#                               grpc++ front door, for $PYTHON (default python3) (what `make native` runs;
#                               the default). The front door needs Debian's libgrpc++-dev and
#                               python3-dev (tools/install-system-deps.sh grpc)
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

build_lib() {
    mkdir -p "$BUILD"
    local out="$BUILD/libmcp_mempool.so"
    local tmp
    tmp="$(mktemp "$BUILD/.libmcp_mempool.so.XXXXXX")"
    "$CC" "${CFLAGS_COMMON[@]}" -fPIC -shared -o "$tmp" "$SRC" || { rm -f "$tmp"; return 1; }
    chmod 755 "$tmp" # mktemp made it 0600: a library others (a container's service user) load
    mv -f "$tmp" "$out"
    echo "built $out"
}

build_frontdoor() {
    local python="${PYTHON:-python3}"
    local suffix includes out tmp
    suffix="$("$python" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')"
    includes="$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
    out="$HERE/mcp_native/_frontdoor$suffix"
    tmp="$(mktemp "$HERE/mcp_native/._frontdoor.XXXXXX")"
    # hidden visibility and the version script: the module exports PyInit__frontdoor alone, so the
    # grpcio wheel's grpc core in the same process never binds to it (tests/integration/test_grpc_cores.py)
    # shellcheck disable=SC2046  # pkg-config's flags are words
    "$CXX" -std=c++17 -O2 -g -Wall -Wextra -Werror -Wno-missing-field-initializers -fPIC -shared \
        -fvisibility=hidden -fvisibility-inlines-hidden -Wl,--version-script="$HERE/src/frontdoor.map" \
        -I"$includes" $(pkg-config --cflags grpc++) -o "$tmp" "${FRONTDOOR_SRC[@]}" $(pkg-config --libs grpc++) ||
        { rm -f "$tmp"; return 1; } # a failed build leaves no temporary file behind
    chmod 755 "$tmp"
    mv -f "$tmp" "$out"
    echo "built $out"
}

build_test() { # build_test OUTPUT EXTRA_FLAGS...
    local out="$1"
    shift
    "$CC" "${CFLAGS_COMMON[@]}" "$@" -o "$out.tmp" "$SRC" "$TEST_SRC"
    mv -f "$out.tmp" "$out"
}

run_tests() {
    build_lib
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
    test) run_tests ;;
    clean) rm -rf "$BUILD" "$HERE"/mcp_native/_frontdoor*.so ;;
    *)
        echo "usage: $0 [lib|test|clean]" >&2
        exit 2
        ;;
esac
