# bootstrap.sh - sourced by tests/run.sh, pipelines/demo.sh and bench/run.sh: installs
# the Debian packages the build needs when missing, then configures and builds.

# Packages, by what needs them (Debian 12 names); each list holds the one before it.
#
# The demo (pipelines/demo.sh): what builds the library, the plugin and xmem-inspect, and
# what the demo runs (gst-launch-1.0, videotestsrc, identity, fakesink). No more: a fresh
# machine gets the demo going in about a minute.
XMEM_DEMO_PACKAGES=(g++ meson ninja-build pkg-config libgstreamer1.0-dev libgstreamer-plugins-base1.0-dev
	gstreamer1.0-tools gstreamer1.0-plugins-base)
# The other scripts of pipelines/: GStreamer's CUDA library (memory:CUDAMemory in the
# elements), autovideosink and the file demuxers (plugins-good), nvcodec's elements
# (plugins-bad).
XMEM_PIPELINES_PACKAGES=("${XMEM_DEMO_PACKAGES[@]}" libgstreamer-plugins-bad1.0-dev
	gstreamer1.0-plugins-good gstreamer1.0-plugins-bad)
# The test suite (tests/run.sh) and the benchmarks: libgtest-dev; libffmpeg-nvenc-dev the
# NVIDIA Video Codec SDK headers for examples/nvdec_producer.cpp; python3-numpy,
# python3-pytest and python3-torch (1.13, CPU) the Python module's tests, python3-gi and
# gir1.2-gstreamer-1.0 the pixel-reading GStreamer consumers of tests/hostile. spin
# checks the protocol model (tests/model); clang and libclang-rt-14-dev build the
# fuzzers (tests/fuzz); clang-format and clang-tidy check the tree; python3-matplotlib
# draws bench/soak.sh's plot; gstreamer1.0-plugins-base-apps has gst-play-1.0, which
# tests/gst/test_uri.cpp plays a pool with.
# The packages' test (tests/packages.sh) builds the Debian packages (debhelper, dh-python),
# checks them (lintian) and installs them into fresh roots (debootstrap); the wheel's
# (tests/wheel.sh) builds it with meson-python in a virtual environment (python3-venv).
# python3-opencv reads a pool by its xmem:// URI (python/tests); iproute2 makes the two
# network namespaces of tests/bridge, python3-yaml reads the manifests of tests/deploy.
XMEM_PACKAGES=("${XMEM_PIPELINES_PACKAGES[@]}" libgtest-dev
	libffmpeg-nvenc-dev python3-numpy python3-pytest python3-torch python3-gi gir1.2-gstreamer-1.0
	spin clang libclang-rt-14-dev clang-format clang-tidy python3-matplotlib gstreamer1.0-plugins-base-apps
	build-essential debhelper dh-python lintian debootstrap python3-venv python3-mesonpy
	python3-opencv iproute2 python3-yaml)

# Debian 13's names for what a Debian 13 root needs to build and test the tree
# (tests/run-debian13.sh) and to make the GPU pack (tools/gpu-pack.sh): the suite's
# packages less what only Debian 12's stages use (clang and its runtime for the fuzzers,
# clang-format and clang-tidy, matplotlib), plus ONNX Runtime and onnx for the ONNX
# example, and patchelf, which points the pack's programs at the loader it carries.
XMEM_DEBIAN13_PACKAGES=(g++ meson ninja-build pkg-config libgtest-dev
	libgstreamer1.0-dev libgstreamer-plugins-base1.0-dev libgstreamer-plugins-bad1.0-dev
	gstreamer1.0-tools gstreamer1.0-plugins-base gstreamer1.0-plugins-good gstreamer1.0-plugins-bad
	libffmpeg-nvenc-dev python3-numpy python3-pytest python3-torch python3-gi gir1.2-gstreamer-1.0
	python3-onnxruntime python3-onnx patchelf python3-opencv iproute2 python3-yaml)

xmem_install_packages() {
	local missing=()
	local p
	for p in "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
	done
	[ ${#missing[@]} -eq 0 ] && return 0
	echo "xmem: installing ${missing[*]}" >&2
	local sudo=()
	[ "$(id -u)" -eq 0 ] || sudo=(sudo)
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# xmem_configure DIR [meson options...]: configures DIR, or applies the options to DIR
# configured before (by the demo, say, before the suite's packages were there: its
# next build then looks for them again).
xmem_configure() {
	local dir=$1
	shift
	if [ ! -f "$dir/build.ninja" ]; then
		meson setup "$dir" "$@"
	elif [ $# -gt 0 ]; then
		meson configure "$dir" "$@"
	fi
}

# Where the built plugin is, for gst-launch-1.0 and gst-inspect-1.0 run from the tree.
xmem_gst_env() {
	local dir=${1:-build}
	export GST_PLUGIN_PATH="$PWD/$dir/gst${GST_PLUGIN_PATH:+:$GST_PLUGIN_PATH}"
}

# xmem_in_root ROOT [SOURCE=TARGET[:ro]]... -- COMMAND...: runs COMMAND as root with ROOT
# as its / (pivot_root, not a chroot: the kernel refuses new user namespaces in a chroot),
# with /proc, /dev, a private /tmp, the host's resolv.conf, and each SOURCE bound at
# TARGET (read-only with :ro; skipped when SOURCE is missing), in a mount namespace of its
# own, so that nothing stays mounted when it ends. A clean environment: PATH, HOME, LANG,
# DEBIAN_FRONTEND, and CI and XMEM_TEST_JOBS passed on. Needs root.
xmem_in_root() {
	local root=$1
	shift
	local binds=()
	while [ $# -gt 0 ] && [ "$1" != "--" ]; do
		binds+=("$1")
		shift
	done
	[ $# -gt 0 ] && shift
	# shellcheck disable=SC2016 # the inner script expands its own arguments
	unshare --mount --propagation private -- /bin/sh -euc '
		root=$1 nbinds=$2
		shift 2
		mount --bind "$root" "$root"
		mount -t proc proc "$root/proc"
		mount --rbind /dev "$root/dev"
		mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
		while [ "$nbinds" -gt 0 ]; do
			source=${1%%=*} target=${1#*=} ro=
			case $target in *:ro) target=${target%:ro} ro=1 ;; esac
			if [ -e "$source" ]; then
				mkdir -p "$root$target"
				mount --bind "$source" "$root$target"
				[ -z "$ro" ] || mount -o remount,bind,ro "$root$target"
			fi
			shift
			nbinds=$((nbinds - 1))
		done
		cp /etc/resolv.conf "$root/etc/resolv.conf"
		cd "$root"
		pivot_root . mnt
		cd /
		/usr/bin/umount -l /mnt
		exec /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
			HOME=/root LANG=C.UTF-8 CI="${CI:-}" XMEM_TEST_JOBS="${XMEM_TEST_JOBS:-2}" \
			DEBIAN_FRONTEND=noninteractive "$@"
	' sh "$root" "${#binds[@]}" "${binds[@]}" "$@"
}

# xmem_debootstrap RELEASE DIR: a minbase root of RELEASE (bookworm, trixie) at DIR, made
# once with debootstrap and kept (XMEM_DEBIAN_MIRROR: the archive).
xmem_debootstrap() {
	local release=$1 dir=$2
	[ -x "$dir/usr/bin/apt-get" ] && return 0
	echo "xmem: making a $release minbase root in $dir" >&2
	rm -rf "$dir.new"
	mkdir -p "$(dirname "$dir")"
	debootstrap --variant=minbase "$release" "$dir.new" "${XMEM_DEBIAN_MIRROR:-http://deb.debian.org/debian}" >/dev/null
	rm -rf "$dir"
	mv "$dir.new" "$dir"
}

# xmem_root_packages ROOT PACKAGE...: installs into ROOT (made by xmem_debootstrap) the
# packages it lacks.
xmem_root_packages() {
	local root=$1
	shift
	local missing=() p
	for p in "$@"; do
		chroot "$root" dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
	done
	[ ${#missing[@]} -eq 0 ] && return 0
	echo "xmem: installing ${missing[*]} in $root" >&2
	xmem_in_root "$root" -- apt-get update -qq
	xmem_in_root "$root" -- apt-get install -y -qq --no-install-recommends "${missing[@]}"
	xmem_in_root "$root" -- apt-get clean
}
