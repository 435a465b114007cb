#!/usr/bin/env bash
# tests/packages.sh RELEASE - xmem's Debian packages as a user installs them: builds them
# from a copy of the tree (dpkg-buildpackage -b -us -uc: on this machine for debian12,
# in the Debian 13 root of tests/run-debian13.sh for debian13), checks them with lintian
# (no errors), installs them with apt into a fresh minbase root of the same release, and
# there, from /, with no variable set: gst-inspect-1.0 finds both elements; a producer
# and a consumer pipeline round-trip frames; the Python module reads a frame as numpy; a
# C++ program builds with pkg-config and runs; xmem-inspect shows a live pool. Then it
# purges them and checks that nothing of xmem is left.
#   RELEASE                 debian12 or debian13
#   XMEM_PACKAGES_KEEP=dir  also copy the built .deb files there
#   XMEM_CACHE_DIR=dir      where the pristine roots are kept (default /var/cache/xmem)
# Needs root (or sudo without a password) and the network for the archive: exit 77
# (skipped) without them.
set -euo pipefail
cd "$(dirname "$0")/.."
release=${1:-}
case $release in
debian12) codename=bookworm ;;
debian13) codename=trixie ;;
*)
	echo "usage: tests/packages.sh debian12|debian13" >&2
	exit 2
	;;
esac
if [ "$(id -u)" -ne 0 ]; then
	if ! sudo -n true 2>/dev/null; then
		echo "packages.sh: skipped: needs root (or sudo without a password) for debootstrap and mounts" >&2
		exit 77
	fi
	exec sudo -n --preserve-env=CI,XMEM_PACKAGES_KEEP,XMEM_CACHE_DIR,XMEM_DEBIAN_MIRROR "$0" "$@"
fi
. tools/bootstrap.sh

cache=${XMEM_CACHE_DIR:-/var/cache/xmem}
pristine=$cache/$release-minbase
[ "$release" = debian12 ] && pristine=$cache/debian12-minbase
build_root=$cache/debian13 # tests/run-debian13.sh's, with the build packages
work=$(mktemp -d /var/tmp/xmem-packages.XXXXXX)
trap 'rm -rf "$work"' EXIT
step() { printf '\n== packages.sh %s: %s\n' "$release" "$*"; }

# The tree as git sees it (committed, and new files not ignored): no build directories.
step "copying the tree"
mkdir -p "$work/src/xmem"
git ls-files -z --cached --others --exclude-standard | xargs -0 -r sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' sh |
	tar --null -T - -cf - | tar -xf - -C "$work/src/xmem"

build_packages=(build-essential debhelper dh-python lintian meson ninja-build pkg-config python3 g++
	libgstreamer1.0-dev libgstreamer-plugins-base1.0-dev libgstreamer-plugins-bad1.0-dev)
step "building the packages"
if [ "$release" = debian12 ]; then
	xmem_install_packages "${build_packages[@]}"
	(cd "$work/src/xmem" && dpkg-buildpackage -b -us -uc >"$work/build.log" 2>&1) || {
		tail -n 60 "$work/build.log"
		exit 1
	}
	(cd "$work/src" && lintian --fail-on error ./*.changes)
else
	xmem_debootstrap trixie "$build_root"
	xmem_in_root "$build_root" "$work/src=/src" "/usr/local/cuda=/usr/local/cuda:ro" -- /bin/sh -ec "
		apt-get update -qq
		apt-get install -y -qq --no-install-recommends ${build_packages[*]} >/dev/null
		cd /src/xmem
		dpkg-buildpackage -b -us -uc >/src/build.log 2>&1 || { tail -n 60 /src/build.log; exit 1; }
		cd /src && lintian --fail-on error ./*.changes"
fi
debs=$(cd "$work/src" && ls ./*.deb | grep -v dbgsym)
echo "$debs"
if [ -n "${XMEM_PACKAGES_KEEP:-}" ]; then
	mkdir -p "$XMEM_PACKAGES_KEEP"
	(cd "$work/src" && cp ./*.deb "$XMEM_PACKAGES_KEEP/")
fi

step "installing into a fresh $codename minbase root"
xmem_debootstrap "$codename" "$pristine"
root=$work/root
cp -a "$pristine/." "$root/"
mkdir -p "$root/debs"
(cd "$work/src" && cp $debs "$root/debs/")
# The tree, for pipelines/demo.sh, which runs on the installed packages of its version.
cp -a "$work/src/xmem" "$root/xmem"
cat >"$root/check.sh" <<'CHECK'
#!/bin/sh
# Inside the fresh root, as a user would: apt installs the packages and what they need.
set -eu
cd /
apt-get update -qq
apt-get install -y -qq --no-install-recommends /debs/*.deb >/dev/null
# What the checks use besides xmem: gst-launch-1.0 and videotestsrc; a compiler.
apt-get install -y -qq --no-install-recommends gstreamer1.0-tools gstreamer1.0-plugins-base g++ pkgconf >/dev/null
export XDG_RUNTIME_DIR=/tmp/run
mkdir -p -m 700 "$XDG_RUNTIME_DIR"

echo "-- gst-inspect-1.0 finds both elements"
gst-inspect-1.0 xmemsink | grep -q "Long-name"
gst-inspect-1.0 xmemsrc | grep -q "Long-name"
gst-inspect-1.0 xmem | sed -n 's/^ *Filename *//p'

echo "-- a producer and a consumer round-trip frames"
gst-launch-1.0 -q videotestsrc num-buffers=300 is-live=true ! video/x-raw,width=320,height=240,framerate=60/1 ! \
	xmemsink pool-name=round wait-for-consumers=1 &
producer=$!
gst-launch-1.0 -q xmemsrc pool-name=round num-buffers=30 timeout=10000000000 ! fakesink
echo "consumer pipeline received 30 frames"

echo "-- xmem-inspect shows the live pool"
xmem-inspect round | tee /tmp/inspect.txt | head -n 5
grep -q "consumers:" /tmp/inspect.txt
wait "$producer"

echo "-- the Python module reads a frame as numpy"
gst-launch-1.0 -q videotestsrc num-buffers=300 is-live=true ! video/x-raw,format=GRAY8,width=64,height=48,framerate=60/1 ! \
	xmemsink pool-name=py wait-for-consumers=1 &
producer=$!
python3 -c '
import numpy, xmem
with xmem.open("py", timeout=10) as c:
    f = c.receive(timeout=10)
    a = numpy.asarray(f)
    assert a.size >= 64 * 48, a.shape
    print("python3: frame", f.meta.seq, "as numpy", a.dtype, a.shape, "from", xmem.__file__)
'
wait "$producer"

echo "-- a C++ program builds with pkg-config and runs"
cat >/tmp/hello.cpp <<'CPP'
#include <xmem/xmem.hpp>
#include <cstdio>
int main()
{
	xmem::PoolConfig config;
	config.slot_count = 2;
	config.slot_size = 64;
	auto owner = xmem::BufferPool::create("cpp", config);
	if (!owner)
		return std::printf("create: %s\n", owner.error().message.c_str()), 1;
	auto consumer = xmem::BufferPool::open("cpp");
	if (!consumer)
		return std::printf("open: %s\n", consumer.error().message.c_str()), 1;
	auto frame = (*owner)->acquire(std::chrono::seconds(1));
	if (!frame || !(*owner)->publish(std::move(*frame)))
		return std::printf("publish failed\n"), 1;
	auto got = (*consumer)->receive(std::chrono::seconds(1));
	if (!got)
		return std::printf("receive: %s\n", got.error().message.c_str()), 1;
	std::printf("C++: frame %llu received\n", (unsigned long long)got->meta().seq);
	return 0;
}
CPP
g++ -std=c++20 -o /tmp/hello /tmp/hello.cpp $(pkg-config --cflags --libs xmem)
/tmp/hello

echo "-- the demo runs on the installed packages, building nothing"
DEMO_FRAMES=30 /xmem/pipelines/demo.sh >/tmp/demo.txt 2>&1 || { cat /tmp/demo.txt; exit 1; }
grep -q "using the installed packages" /tmp/demo.txt || { cat /tmp/demo.txt; echo "the demo did not use them"; exit 1; }
if [ -e /xmem/build ]; then
	echo "the demo made a build directory"
	exit 1
fi
tail -n 3 /tmp/demo.txt

echo "-- purged, nothing of xmem is left"
apt-get purge -y -qq libxmem0 libxmem-dev gstreamer1.0-xmem python3-xmem xmem-tools >/dev/null
if dpkg -l | grep -E "^[a-z][a-z] +(libxmem0|libxmem-dev|gstreamer1.0-xmem|python3-xmem|xmem-tools)[: ]"; then
	echo "still installed (above)"
	exit 1
fi
left=$(find /usr /etc /var/lib/dpkg/info -name '*xmem*' 2>/dev/null || true)
if [ -n "$left" ]; then
	echo "left behind:"
	echo "$left"
	exit 1
fi
gst-inspect-1.0 xmemsink >/dev/null 2>&1 && { echo "gst-inspect-1.0 still finds xmemsink"; exit 1; }
echo "packages.sh: every check passed"
CHECK
chmod +x "$root/check.sh"
step "checking in the fresh root"
xmem_in_root "$root" -- /check.sh
