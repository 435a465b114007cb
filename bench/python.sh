#!/usr/bin/env bash
# bench/python.sh [python.py options] - bench/python.py with Debian's interpreter and
# what it needs: the build's plugin and library, python3-torch, GStreamer through gi.
# XMEM_SKIP_SETUP=1: the build in XMEM_BUILD_DIR as it is, nothing installed or compiled.
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/bootstrap.sh
build=${XMEM_BUILD_DIR:-build}
if [ -z "${XMEM_SKIP_SETUP:-}" ]; then
	xmem_install_packages "${XMEM_PACKAGES[@]}" python3-gi gir1.2-gst-plugins-base-1.0
	xmem_configure "$build" -Dtests=enabled
	meson compile -C "$build" >/dev/null
elif [ ! -e "$build/lib/libxmem.so.0" ] || [ ! -e "$build/gst/libgstxmem.so" ]; then
	echo "python.sh: $build has no libxmem.so.0 or libgstxmem.so (build it, or leave XMEM_SKIP_SETUP unset)" >&2
	exit 2
fi
xmem_gst_env "$(realpath --relative-to="$PWD" "$build")"
export PYTHONPATH=$PWD/python XMEM_LIBRARY=$(realpath "$build")/lib/libxmem.so.0
exec "${XMEM_PYTHON:-/usr/bin/python3}" bench/python.py "$@"
