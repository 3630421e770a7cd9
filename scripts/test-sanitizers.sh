#!/usr/bin/env bash
# The C extensions' tests under AddressSanitizer and UndefinedBehaviorSanitizer (make
# test-sanitizers, run by .ci/run). sidecar/base/_speedups.c and
# sidecar/relay/data/_token_lane.c are built with -fsanitize=address,undefined into a copy of
# the package in a temporary folder (the working tree's own build is left alone), and the
# tests that drive them run there: the byte checks against their Python originals, the token lane against the Python relay path, and every
# entry point misused (tests/unit/base/test_speedups_misuse.py).
#
# Built without -fwrapv (which Python's own CFLAGS, and so setuptools' build, carry): with it
# a signed overflow is defined to wrap and UBSan does not see it. Any report aborts the test
# process (-fno-sanitize-recover, halt_on_error), so it fails. The interpreter is not built
# with ASan, so libasan is preloaded; PYTHONMALLOC=malloc sends Python's objects through
# ASan's allocator too; leak detection is off (an interpreter frees little at exit).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="$(realpath -s "${PY:-.venv/bin/python}")"
CC="${CC:-gcc}"
command -v "$CC" >/dev/null || { echo "test-sanitizers: no C compiler ($CC)" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cp -r sidecar tests bench pyproject.toml "$work/"
find "$work" \( -name '*.so' -o -name __pycache__ \) -prune -exec rm -rf {} +

include="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
suffix="$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')"
"$CC" -shared -fPIC -O1 -g -fno-omit-frame-pointer \
    -fsanitize=address,undefined -fno-sanitize-recover=all \
    -Wall -Werror -I"$include" \
    sidecar/base/_speedups.c -o "$work/sidecar/base/_speedups$suffix"
"$CC" -shared -fPIC -O1 -g -fno-omit-frame-pointer \
    -fsanitize=address,undefined -fno-sanitize-recover=all \
    -Wall -Werror -I"$include" \
    sidecar/relay/data/_token_lane.c -o "$work/sidecar/relay/data/_token_lane$suffix"

export LD_PRELOAD="$("$CC" -print-file-name=libasan.so)"
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:halt_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:abort_on_error=1"
export PYTHONMALLOC=malloc
export CI="${CI:-true}"  # the tests that skip without the extension must fail instead
cd "$work"
# The copy with the sanitized build is the one imported (pytest puts this folder first).
for ext in sidecar.base._speedups sidecar.relay.data._token_lane; do
    "$PY" -c 'import importlib, sys; m = importlib.import_module(sys.argv[2]); sys.exit(0 if m.__file__.startswith(sys.argv[1]) else f"imported {m.__file__}")' "$work" "$ext"
done
"$PY" -m pytest -q -p no:cacheprovider \
    tests/unit/base/test_speedups_misuse.py tests/unit/base/test_speedups.py \
    tests/unit/streams/test_hot_path_equivalence.py tests/unit/relay/data/test_token_lane.py "$@"
