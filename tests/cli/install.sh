#!/usr/bin/env bash
# Installs the build into a scratch prefix with `cmake --install`, then builds
# an embedding program against it through the generated ectransfer.pc, both
# shared and static, and runs them.
. "$(dirname "$0")/lib.sh"
: "${ECT_BUILD_DIR:?}" "${ECT_SOURCE_DIR:?}"
prefix=$tmp
cmake --install "$ECT_BUILD_DIR" --prefix "$prefix" >/dev/null
libdir=$(ls -d "$prefix"/lib*/ | head -n1)
test -f "$prefix/include/ectransfer.h"
test -x "$prefix/bin/ect"
test -f "$libdir/pkgconfig/ectransfer.pc"
export PKG_CONFIG_PATH="$libdir/pkgconfig"
# A sanitizer build of the library needs the same runtime in the program.
san=""
case "$("$prefix/bin/ect" info | sed -n 's/.*sanitize=\([a-z]*\).*/\1/p')" in
  address) san="-fsanitize=address,undefined" ;;
  thread) san="-fsanitize=thread" ;;
esac
pkg-config --modversion ectransfer
cc -std=c11 -Wall -Werror $san "$ECT_SOURCE_DIR/examples/version.c" -o "$prefix/v_shared" \
  $(pkg-config --cflags --libs ectransfer)
LD_LIBRARY_PATH="$libdir" "$prefix/v_shared" | grep -q '^ectransfer .*pool is full'
cc -std=c11 -Wall -Werror $san "$ECT_SOURCE_DIR/examples/version.c" -o "$prefix/v_static" \
  $(pkg-config --cflags ectransfer) "$libdir/libectransfer.a" $(pkg-config --static --libs-only-l ectransfer | sed 's/-lectransfer//')
"$prefix/v_static" | grep -q 'pool is full'
"$prefix/bin/ect" --version | grep -q '^ect '
# The Python package, installed beside the library, loads the installed library (no
# ECT_LIBRARY, no source tree on the path). A sanitizer build's library needs its runtime
# preloaded into the interpreter: checked by the Python tests, not here.
py=$(find "$prefix" -type d -name ectransfer -path '*-packages/*' | head -n1)
test -f "$py/__init__.py" && test -f "$py/vllm.py"
grep -q "^LIBRARY = '$libdir" "$py/_install.py" || grep -q "^LIBRARY = '$prefix/lib" "$py/_install.py"
if [ -z "$san" ] && command -v /usr/bin/python3 >/dev/null; then
  (cd / && env -u ECT_LIBRARY PYTHONPATH="$(dirname "$py")" /usr/bin/python3 -c \
    "import ectransfer, sys; p = ectransfer.LIBRARY_PATH; assert p.startswith(sys.argv[1]), p" "$prefix")
fi
echo "install: ok"
