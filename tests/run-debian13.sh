#!/usr/bin/env bash
# tests/run-debian13.sh - the suite on the second tested platform: Debian 13 ("trixie":
# GStreamer 1.26, GCC 14, Python 3.13 with numpy 2.2 and torch 2.6, ONNX Runtime).
# Makes a Debian 13 root with debootstrap (or reuses the one made before on this
# machine), installs the build and test packages there, builds the current tree in it
# and runs the suite with meson test, CUDA on the driver simulator as on Debian 12.
# The protocol model, the sanitizers and the long fuzzing run on Debian 12 only.
#   XMEM_DEBIAN13_ROOT=dir  where the root lives (default /var/cache/xmem/debian13)
#   BUILD=dir               build directory in the tree (default build-debian13)
#   TEST_ARGS="..."         extra options for meson test (e.g. a test's name)
#   XMEM_DEBIAN_MIRROR=url  the archive (default http://deb.debian.org/debian)
# Needs root for debootstrap, chroot and mounts: run as root, or it asks sudo.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
	exec sudo --preserve-env=CI,XMEM_DEBIAN13_ROOT,BUILD,TEST_ARGS,XMEM_DEBIAN_MIRROR,XMEM_TEST_JOBS "$0" "$@"
fi

. tools/bootstrap.sh

root=${XMEM_DEBIAN13_ROOT:-/var/cache/xmem/debian13}
build=${BUILD:-build-debian13}
tree=$PWD
cuda_prefix=/usr/local/cuda

# The CUDA pools need the toolkit's cuda.h, which Debian 13's archive has only in
# non-free (nvidia-cuda-toolkit, 12.x); the root sees the host's, read-only. CI has it,
# so there a missing one is an error; elsewhere the build goes on without CUDA.
cuda=enabled
if [ ! -f "$cuda_prefix/include/cuda.h" ]; then
	if [ "${CI:-}" = "true" ]; then
		echo "run-debian13.sh: no $cuda_prefix/include/cuda.h (the CUDA toolkit's headers)" >&2
		exit 1
	fi
	echo "run-debian13.sh: no $cuda_prefix/include/cuda.h: building without the CUDA pools" >&2
	cuda=disabled
fi

xmem_install_packages debootstrap

# The root with the tree at /xmem and the CUDA headers, read-only (tools/bootstrap.sh).
in_root() {
	xmem_in_root "$root" "$tree=/xmem" "$cuda_prefix=$cuda_prefix:ro" -- "$@"
}

xmem_debootstrap trixie "$root"

xmem_root_packages "$root" "${XMEM_DEBIAN13_PACKAGES[@]}"

args=(-Dtests=enabled "-Dcuda=$cuda" "-Dgst-cuda=$([ $cuda = enabled ] && echo enabled || echo disabled)"
	"-Dcuda-prefix=$cuda_prefix")
[ "${CI:-}" = "true" ] && args+=(-Dwerror=true)
# A build directory made outside the root (its paths are not the root's) is redone.
if [ -f "$build/build.ninja" ] && ! grep -q "/xmem/" "$build/build.ninja"; then
	rm -rf "$build"
fi
in_root /bin/sh -ec "cd /xmem && { [ -f '$build/build.ninja' ] || meson setup '$build' ${args[*]}; } && meson compile -C '$build'"
# The model (spin) ran on Debian 12; nothing about it differs here. Nor the packages'
# suite, which builds and installs Debian 13's packages from Debian 12 (tests/packages.sh).
in_root /bin/sh -ec "cd /xmem && meson test -C '$build' --print-errorlogs --num-processes \${XMEM_TEST_JOBS} \
	--no-suite model --no-suite packages ${TEST_ARGS:-}"
