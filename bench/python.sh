#!/usr/bin/env bash
# bench/python.sh [python.py options] - bench/python.py with Debian's interpreter and
# what it needs: the build's plugin and library, python3-torch, GStreamer through gi.
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/bootstrap.sh
xmem_install_packages "${XMEM_PACKAGES[@]}" python3-gi gir1.2-gst-plugins-base-1.0
build=${XMEM_BUILD_DIR:-build}
xmem_configure "$build" -Dtests=enabled
meson compile -C "$build" >/dev/null
xmem_gst_env "$(realpath --relative-to="$PWD" "$build")"
export PYTHONPATH=$PWD/python XMEM_LIBRARY=$(realpath "$build")/lib/libxmem.so.0
exec "${XMEM_PYTHON:-/usr/bin/python3}" bench/python.py "$@"
