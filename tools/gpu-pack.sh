#!/usr/bin/env bash
# tools/gpu-pack.sh [DIR] - the GPU pack: everything xmem's GPU tests and benchmarks need on
# a machine that has a GPU, its driver and a Python with torch, but no GStreamer and
# perhaps an older C library. DIR (default .gpu, at most 64 MiB) holds:
#   build/  a release build with the CUDA feature, made in the Debian 13 root that
#           tests/run-debian13.sh keeps (GStreamer 1.26: xmemsrc wraps device slots);
#           object files left out, debug information stripped
#   root/   Debian 13's GStreamer: gst-launch-1.0, gst-inspect-1.0, the plugin scanner
#           and the plugins the tests and benchmarks use (nvcodec: cudaupload,
#           cudaipcsink, cudaipcsrc, nvh264dec)
#   lib/    every library those programs need, Debian 13's C library and dynamic
#           loader included, so nothing of the machine's userland is loaded but its
#           CUDA driver (libcuda.so.1, libnvcuvid.so.1), which is found as usual
#   py/     libxmem.so.0 and the CUDA simulator built on Debian 12 (C library 2.36) for
#           the machine's own Python, whose C library may be older than Debian 13's
#   tests/  each meson test of the build: its command, environment, timeout, suites
#   run     the one entry point: DIR/run --help
# Every program of the pack has Debian 13's loader as its interpreter (DIR/run sets the
# path where the pack lies, with the patchelf the pack carries) and the pack's lib/ in
# its RUNPATH, so no variable points any process at the pack's libraries: the machine's
# own programs (bash, python3) keep their own.
# Copy DIR with the tree to the GPU machine (device tool: `carry: [".gpu"]`, and
# `echo /.gpu/ >> .git/info/exclude` here first), then there: DIR/run --gpu; DIR/run
# --python; DIR/run --compare. Here, DIR/run --sim ... runs the same on the simulator.
#   XMEM_DEBIAN13_ROOT=dir  the Debian 13 root (default /var/cache/xmem/debian13; made
#                           when missing, as tests/run-debian13.sh makes it)
#   BUILD=dir               the Debian 13 build directory in the tree (default build-gpu)
#   BUILD12=dir             the Debian 12 build of py/ (default build-gpu12)
# Needs root (debootstrap, chroot, mounts): run as root, or it asks sudo.
set -euo pipefail
cd "$(dirname "$0")/.."

# The plugins kept (the rest of GStreamer is most of its size): what the tests, the
# pipelines and the benchmarks run.
KEEP_PLUGINS="coreelements app videotestsrc videoconvertscale videorate debugutilsbad nvcodec openh264
videoparsersbad isomp4 typefindfunctions playback autodetect shm unixfd matroska rawparse codectimestamper"
# glibc's libraries that the CUDA driver names (libpthread, libdl and librt are empty
# since glibc 2.34, and nothing of Debian 13 asks for them): every program of the pack
# loads them, so that the driver gets Debian 13's and never the machine's (an older
# glibc's libpthread.so.0 has code of its own and needs that glibc's private symbols).
GLIBC_STUBS="libpthread.so.0 libdl.so.2 librt.so.1 libm.so.6"
LOADER=ld-linux-x86-64.so.2

# Writes DIR/tests/NAME/{cmd,env,info} for the tests the pack keeps; prints the paths,
# relative to the build, of the build's files they name.
# shellcheck disable=SC2016 # Python, not the shell
TESTS_PY='
import json, os, re, sys
build, pack = sys.argv[1], sys.argv[2]
packed = set(os.listdir(os.path.join(pack, "root/usr/bin")))
tests = json.load(sys.stdin)
names = {t["name"] for t in tests}
def kept(n):
    return (n.endswith("-gpu") or (n.endswith("-sim") and n[:-4] + "-gpu" in names)
            or "cudaipc" in n or n.startswith("cudacount"))
referenced = set()
def path(p):
    if not p.startswith("/"):
        return p
    p = os.path.normpath(p)
    if p == build or p.startswith(build + "/"):
        referenced.add(os.path.relpath(p, build))
        return "@BUILD@" + p[len(build):]
    if p == "/xmem" or p.startswith("/xmem/"):
        return "@SRC@" + p[len("/xmem"):]
    m = re.fullmatch(r"/usr/bin/([\w.+-]+)", p)
    if m and m.group(1) in packed:
        return "@ROOT@" + p
    return p
def moved(s):
    return ":".join(path(p) for p in s.split(":"))
for t in tests:
    if not kept(t["name"]):
        continue
    d = os.path.join(pack, "tests", t["name"])
    os.makedirs(d)
    with open(os.path.join(d, "cmd"), "wb") as f:
        f.write(b"".join(moved(c).encode() + b"\0" for c in t["cmd"]))
    with open(os.path.join(d, "env"), "wb") as f:
        f.write(b"".join(("%s=%s" % (k, moved(v))).encode() + b"\0" for k, v in sorted((t.get("env") or {}).items())))
    with open(os.path.join(d, "info"), "w") as f:
        f.write("timeout=%d\nshould_fail=%d\nworkdir=%s\nsuites=%s\n" % (
            t.get("timeout") or 300, 1 if t.get("should_fail") else 0,
            moved(t.get("workdir") or build), " ".join(t.get("suite") or [])))
print("\n".join(sorted(referenced)))
'

# Inside the root: the pack from the build at /xmem/$BUILD into /pack.
pack_in_root() {
	local build=/xmem/$1 pack=/pack
	local gstlib=/usr/lib/x86_64-linux-gnu/gstreamer-1.0
	local scanner=/usr/lib/x86_64-linux-gnu/gstreamer1.0/gstreamer-1.0/gst-plugin-scanner
	find "$pack" -mindepth 1 -maxdepth 1 ! -name py -exec rm -rf {} +
	mkdir -p "$pack/build" "$pack/root/usr/bin" "$pack/root$gstlib" "$pack/root$(dirname "$scanner")" \
		"$pack/lib" "$pack/bin" "$pack/tests"

	# The build without what only building needs.
	(cd "$build" && find . \( -type f -o -type l \) ! -name '*.o' ! -name '*.a' ! -name '*.d' \
		! -path '*.p/*' ! -path './meson-private/*' ! -path './meson-logs/*' ! -name '*.ninja' \
		! -name '.ninja_*' ! -name 'registry*.bin' ! -name 'compile_commands.json' -print0) |
		(cd "$build" && tar --null -cf - -T -) | (cd "$pack/build" && tar -xf -)
	cp /usr/bin/gst-launch-1.0 /usr/bin/gst-inspect-1.0 "$pack/root/usr/bin/"
	cp "$scanner" "$pack/root$scanner"
	local p
	for p in $KEEP_PLUGINS; do
		cp "$gstlib/libgst$p.so" "$pack/root$gstlib/"
	done
	cp /usr/bin/patchelf "$pack/bin/"

	# The tests meant for a GPU, their twins on the simulator and the other tests of
	# nvcodec's CUDA IPC and the copy counter: command, environment and the rest, with
	# the paths of this build made placeholders that DIR/run replaces (@BUILD@, @SRC@,
	# @ROOT@ for /usr/bin tools the pack has). The other test programs stay out.
	meson introspect --tests "$build" | python3 -c "$TESTS_PY" "$build" "$pack" >"$pack/.referenced"
	while IFS= read -r -d '' f; do
		head -c 4 "$f" | grep -q ELF || continue
		case ${f#"$pack"/build/} in tests/cudasim/*) continue ;; esac
		grep -qxF "${f#"$pack"/build/}" "$pack/.referenced" || rm -f "$f"
	done < <(find "$pack/build/tests" -type f -print0)
	rm -f "$pack/.referenced"

	# Every ELF file of the pack, and the libraries they need from the root.
	# (py/ is Debian 12's, for the machine's own processes: left as built.)
	local elves=() f
	while IFS= read -r -d '' f; do
		head -c 4 "$f" | grep -q ELF && elves+=("$f")
	done < <(find "$pack" -path "$pack/py" -prune -o -type f -print0)
	local libs
	libs=$(for f in "${elves[@]}"; do ldd "$f" 2>/dev/null || true; done |
		awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\/.*ld-linux/ { print $1 }' |
		grep -v -e '^/xmem/' -e '^/pack/' | sort -u)
	for f in $libs $(for s in $GLIBC_STUBS; do echo "/usr/lib/x86_64-linux-gnu/$s"; done); do
		cp -L "$f" "$pack/lib/$(basename "$f")"
	done
	if grep -l "libcuda.so.1 => not found" <(for f in "${elves[@]}"; do ldd "$f" 2>/dev/null; done) >/dev/null; then
		echo "gpu-pack.sh: a program of the pack links libcuda.so.1 directly" >&2
	fi

	# Debug information is most of a build's size; the GPU machine only runs it.
	for f in "${elves[@]}" "$pack"/lib/*; do
		strip --strip-debug "$f" 2>/dev/null || true
	done

	# The pack's lib/ in every program's and library's RUNPATH, after its own entries;
	# the glibc stubs loaded by every program (see GLIBC_STUBS).
	local executables=()
	for f in "${elves[@]}" "$pack"/lib/*; do
		case $(basename "$f") in
		"$LOADER" | libc.so.6 | libm.so.6 | libpthread.so.0 | libdl.so.2 | librt.so.1) continue ;;
		esac
		local rel old new
		rel=$(realpath --relative-to="$(dirname "$f")" "$pack/lib")
		old=$(patchelf --print-rpath "$f" 2>/dev/null || true)
		new="${old:+$old:}\$ORIGIN/$rel"
		[ "$rel" = . ] && new="${old:+$old:}\$ORIGIN"
		patchelf --set-rpath "$new" "$f"
		if patchelf --print-interpreter "$f" >/dev/null 2>&1; then
			# shellcheck disable=SC2046 # one --add-needed per stub
			patchelf $(for s in $GLIBC_STUBS; do echo --add-needed "$s"; done) "$f"
			# patchelf itself always runs through the loader (DIR/run): it cannot
			# rewrite the file it runs from.
			[ "$f" = "$pack/bin/patchelf" ] || executables+=("${f#"$pack"/}")
		fi
	done
	printf '%s\n' "${executables[@]}" >"$pack/executables"

	cp /xmem/tools/gpu-run.sh "$pack/run"
	chmod +x "$pack/run"
	{
		echo "made=$(date -u +%Y-%m-%dT%H:%MZ)"
		echo "commit=$2"
		echo "gstreamer=$(gst-launch-1.0 --version | sed -n 's/.*version //p' | head -1)"
		echo "glibc=$(ldd --version | head -1 | awk '{ print $NF }')"
	} >"$pack/about"
}

if [ "${1:-}" = --in-root ]; then
	pack_in_root "$2" "$3"
	exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
	exec sudo --preserve-env=XMEM_DEBIAN13_ROOT,BUILD,BUILD12,XMEM_DEBIAN_MIRROR "$0" "$@"
fi
# shellcheck source=tools/bootstrap.sh
. tools/bootstrap.sh

out=${1:-.gpu}
root=${XMEM_DEBIAN13_ROOT:-/var/cache/xmem/debian13}
build=${BUILD:-build-gpu}
build12=${BUILD12:-build-gpu12}
cuda_prefix=/usr/local/cuda
tree=$PWD
[ -f "$cuda_prefix/include/cuda.h" ] || {
	echo "gpu-pack.sh: no $cuda_prefix/include/cuda.h: the pack is the CUDA build" >&2
	exit 1
}
case $out in /*) ;; *) out=$tree/$out ;; esac

# Debian 12's part first: the library and the simulator for the machine's own Python.
xmem_install_packages "${XMEM_PIPELINES_PACKAGES[@]}" libgtest-dev debootstrap
xmem_configure "$build12" -Dbuildtype=release -Dcuda=enabled -Dgst-cuda=disabled -Dgstreamer=disabled \
	-Dtests=enabled "-Dcuda-prefix=$cuda_prefix"
meson compile -C "$build12" xmem tests/cudasim/cuda >/dev/null
rm -rf "$out"
mkdir -p "$out/py/cudasim"
cp -L "$build12/lib/libxmem.so.0" "$out/py/"
cp -L "$build12/tests/cudasim/libcuda.so.1" "$out/py/cudasim/"
strip --strip-debug "$out/py/libxmem.so.0" "$out/py/cudasim/libcuda.so.1"

# Debian 13's part: its root, the release build in it, and the pack made there.
xmem_debootstrap trixie "$root"
xmem_root_packages "$root" "${XMEM_DEBIAN13_PACKAGES[@]}"
in_root() {
	xmem_in_root "$root" "$tree=/xmem" "$cuda_prefix=$cuda_prefix:ro" "$out=/pack" -- "$@"
}
if [ -f "$build/build.ninja" ] && ! grep -q "/xmem/" "$build/build.ninja"; then
	rm -rf "$build" # made outside the root: its paths are not the root's
fi
in_root /bin/sh -ec "cd /xmem && { [ -f '$build/build.ninja' ] || meson setup '$build' -Dbuildtype=release \
	-Dcuda=enabled -Dgst-cuda=enabled -Dtests=enabled -Dcuda-prefix=$cuda_prefix >/dev/null; } \
	&& meson compile -C '$build' >/dev/null"
in_root bash /xmem/tools/gpu-pack.sh --in-root "$build" \
	"$(git rev-parse --short HEAD)$(git diff --quiet HEAD 2>/dev/null || echo +changes)"

mb=$(du -sm "$out" | cut -f1)
echo "gpu-pack.sh: $out holds ${mb} MiB ($(grep -c . "$out/executables") programs, $(find "$out/lib" -type f | wc -l) libraries, $(find "$out/tests" -mindepth 1 -maxdepth 1 | wc -l) tests)"
if [ "$mb" -gt 64 ]; then
	echo "gpu-pack.sh: $out is over 64 MiB, the most the GPU machine takes with the tree" >&2
	exit 1
fi
