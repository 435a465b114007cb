#!/usr/bin/env bash
# pipelines/cuda-producer.sh [--file FILE] [POOL] - frames in CUDA device memory,
# published into the xmem pool POOL (default gpu0) until Ctrl-C or the end of FILE:
# FILE (H.264, in MP4, Matroska or a raw stream) decoded on the GPU by nvh264dec, or
# without --file a live test pattern uploaded once with cudaupload. xmemsink then
# copies each frame device to device into its pool (GStreamer 1.22 cannot share the
# decoder's memory); nothing crosses the PCIe bus after the upload or decode.
# Exits 77 where nvcodec's elements are missing (no gstreamer1.0-plugins-bad, no
# NVIDIA driver or GPU). Watch it with pipelines/cuda-consumer.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
. pipelines/common.sh

file=
if [ "${1:-}" = "--file" ]; then
	file=${2:?--file needs a path}
	shift 2
fi
pool=${1:-gpu0}

xmem_pipelines_setup

# needs ELEMENT WHY: exits 77 (skipped) when ELEMENT is not registered.
needs() {
	if ! gst-inspect-1.0 "$1" >/dev/null 2>&1; then
		echo "cuda-producer.sh: $1 is not available: $2" >&2
		exit 77
	fi
}

if [ -n "$file" ]; then
	[ -r "$file" ] || { echo "cuda-producer.sh: cannot read $file" >&2; exit 1; }
	needs nvh264dec "it needs gstreamer1.0-plugins-bad, an NVIDIA GPU and its driver's libnvcuvid.so.1"
	xmem_launch \
		filesrc location="$file" \
		! parsebin \
		! nvh264dec \
		! 'video/x-raw(memory:CUDAMemory)' \
		! xmemsink pool-name="$pool" wait-for-consumers="${XMEM_WAIT_FOR_CONSUMERS:-0}"
fi

needs cudaupload "it needs gstreamer1.0-plugins-bad and a CUDA driver (libcuda.so.1)"
xmem_launch \
	videotestsrc is-live=true ${XMEM_NUM_BUFFERS:+num-buffers=$XMEM_NUM_BUFFERS} \
	! video/x-raw,format=NV12,width=1280,height=720,framerate=30/1 \
	! cudaupload \
	! 'video/x-raw(memory:CUDAMemory)' \
	! xmemsink pool-name="$pool"
