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
XMEM_PACKAGES=("${XMEM_PIPELINES_PACKAGES[@]}" libgtest-dev
	libffmpeg-nvenc-dev python3-numpy python3-pytest python3-torch python3-gi gir1.2-gstreamer-1.0
	spin clang libclang-rt-14-dev clang-format clang-tidy python3-matplotlib gstreamer1.0-plugins-base-apps)

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
