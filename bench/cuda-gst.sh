#!/usr/bin/env bash
# bench/cuda-gst.sh [FRAMES] - device frames through xmemsink and xmemsrc, on a GPU only:
# 1080p and 4K NV12 frames in CUDA memory (videotestsrc ! cudaupload) published into a
# device pool by one gst-launch-1.0 and taken as CUDA memory by another, unthrottled,
# against the in-process floor (the same producer and consumer joined by a queue in
# one process); then the sink's device-to-device plane copy against the device's plain
# copy bandwidth (bench/xmem-bench-cuda --copy-bandwidth). Frames per second are whole
# runs of FRAMES frames (default 600), start-up included on both sides of each ratio.
# Exits 77 without nvcodec's elements; refuses the CUDA simulator (its timings mean
# nothing) unless XMEM_BENCH_ALLOW_SIM=1.
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/bootstrap.sh
build=${XMEM_BUILD_DIR:-build}
frames=${1:-600}
xmem_gst_env "$(realpath --relative-to="$PWD" "$build")"

if ! gst-inspect-1.0 cudaupload >/dev/null 2>&1; then
	echo "cuda-gst.sh: nvcodec's cudaupload is not available: this benchmark needs a GPU" >&2
	exit 77
fi
case "${XMEM_CUDA_DRIVER:-}${LD_LIBRARY_PATH:-}" in
*cudasim*)
	[ "${XMEM_BENCH_ALLOW_SIM:-}" = 1 ] || { echo "cuda-gst.sh: on the CUDA simulator: timings would mean nothing" >&2; exit 77; }
	echo "WARNING: on the CUDA simulator: these figures say nothing about a GPU" ;;
esac

export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-$(mktemp -d)}
now() { date +%s.%N; }
fps() { awk -v n="$frames" -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", n / (b - a) }'; }

echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo 'GPU: unknown')"
for res in 1920x1080 3840x2160; do
	w=${res%x*} h=${res#*x}
	caps="video/x-raw,format=NV12,width=$w,height=$h,framerate=1000/1"
	cuda='video/x-raw(memory:CUDAMemory)'
	producer=(videotestsrc num-buffers="$frames" pattern=solid-color ! "$caps" ! cudaupload ! "$cuda")

	t0=$(now)
	gst-launch-1.0 -q "${producer[@]}" ! queue max-size-buffers=4 ! fakesink sync=false
	floor=$(fps "$t0" "$(now)")

	pool=bench-cuda-$w
	gst-launch-1.0 -q xmemsrc pool-name="$pool" is-live=false ! "$cuda" ! fakesink sync=false &
	consumer=$!
	t0=$(now)
	gst-launch-1.0 -q "${producer[@]}" ! xmemsink pool-name="$pool" wait-for-consumers=1 policy=block \
		block-timeout=10000000000 buffers=4
	wait "$consumer"
	xmem=$(fps "$t0" "$(now)")
	ratio=$(awk -v a="$xmem" -v b="$floor" 'BEGIN { printf "%.2f", a / b }')
	echo "${w}x${h} NV12 CUDA: in-process $floor fps, xmemsink->xmemsrc $xmem fps, ratio $ratio"

	"$build/bench/xmem-bench-cuda" --copy-bandwidth --width "$w" --height "$h" --frames 2000
done
