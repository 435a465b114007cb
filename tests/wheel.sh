#!/usr/bin/env bash
# tests/wheel.sh BUILD_DIR - the Python module as a wheel (pyproject.toml, meson-python):
# builds it from a copy of the tree in a virtual environment that sees Debian's packages
# (pip wheel --no-build-isolation --no-index: nothing from PyPI), installs it into a
# second one, and the tree itself into a third (pip install --no-build-isolation .); in
# each, from /, with XMEM_LIBRARY, PYTHONPATH and LD_LIBRARY_PATH unset, the module
# attaches to a pool that gst-launch-1.0 makes (the plugin of BUILD_DIR) and reads a frame
# as numpy, through the libxmem.so installed beside it.
# Exit 77 (skipped) without python3-venv or python3-mesonpy.
set -euo pipefail
cd "$(dirname "$0")/.."
build=$(realpath "${1:-build}")
python=${XMEM_PYTHON:-/usr/bin/python3}
if ! "$python" -c 'import ensurepip, mesonpy' 2>/dev/null; then
	echo "wheel.sh: skipped: needs python3-venv and python3-mesonpy (tests/run.sh installs them)" >&2
	exit 77
fi
if [ ! -e "$build/gst/libgstxmem.so" ]; then
	echo "wheel.sh: skipped: no plugin in $build/gst to make a pool with" >&2
	exit 77
fi
work=$(mktemp -d)
producer=
trap '[ -z "$producer" ] || kill "$producer" 2>/dev/null || true; rm -rf "$work"' EXIT

# The tree as git sees it (committed, and new files not ignored): no build directories.
mkdir "$work/src"
git ls-files -z --cached --others --exclude-standard | xargs -0 -r sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' sh |
	tar --null -T - -cf - | tar -xf - -C "$work/src"
"$python" -m venv --system-site-packages "$work/build-venv"
(cd "$work/src" && "$work/build-venv/bin/pip" wheel -q --no-build-isolation --no-index --no-deps -w "$work/dist" .) ||
	{
		echo "wheel.sh: the wheel did not build" >&2
		exit 1
	}
wheel=$(ls "$work"/dist/xmem-*.whl)
echo "wheel: $(basename "$wheel")"
"$python" -c 'import sys, zipfile; sys.exit("xmem/libxmem.so" not in zipfile.ZipFile(sys.argv[1]).namelist())' "$wheel" || {
	echo "wheel.sh: the wheel carries no libxmem.so" >&2
	exit 1
}
# As the README says: the wheel into one environment, and the tree itself into another.
"$python" -m venv --system-site-packages "$work/venv"
"$work/venv/bin/pip" install -q --no-index --no-deps "$wheel"
"$python" -m venv --system-site-packages "$work/venv-src"
(cd "$work/src" && "$work/venv-src/bin/pip" install -q --no-build-isolation --no-index .) || {
	echo "wheel.sh: pip install --no-build-isolation . failed" >&2
	exit 1
}

export XDG_RUNTIME_DIR=$work/run
mkdir -m 700 "$XDG_RUNTIME_DIR"
GST_PLUGIN_PATH=$build/gst gst-launch-1.0 -q videotestsrc num-buffers=600 is-live=true ! \
	video/x-raw,format=GRAY8,width=64,height=48,framerate=60/1 ! xmemsink pool-name=wheel &
producer=$!
cd /
for venv in "$work/venv" "$work/venv-src"; do
	env -u PYTHONPATH -u XMEM_LIBRARY -u GST_PLUGIN_PATH -u LD_LIBRARY_PATH "$venv/bin/python" - "$venv" <<'EOF'
import os
import sys

import numpy

import xmem

venv = sys.argv[1]
assert xmem.__file__.startswith(venv), "the module came from " + xmem.__file__
assert xmem.lib._name == os.path.join(os.path.dirname(xmem.__file__), "libxmem.so"), xmem.lib._name
with xmem.open("wheel", timeout=10) as c:
    f = c.receive(timeout=10)
    a = numpy.asarray(f)
    assert a.shape[:2] == (48, 64), a.shape
    print("wheel.sh: frame %d read as numpy %s %s through %s" % (f.meta.seq, a.dtype, a.shape, xmem.lib._name))
EOF
done
