#!/usr/bin/env bash
# pipelines/cuda-consumer.sh [--display] [POOL] - attaches to the xmem device pool POOL
# (default gpu0) and keeps its frames on the GPU: xmemsrc hands them on as CUDA memory
# (one device-to-device copy: GStreamer 1.22 cannot wrap the pool's memory), cudaconvert
# turns them into RGBA where it is available (it compiles its kernels with NVRTC), and
# cudadownload brings the result to the CPU once for fakesink, or for the screen with
# --display. XMEM_POLICY=fifo asks for every frame (the producer waits for this
# consumer; see xmemsrc's policy). Exits 77 where nvcodec's elements are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
. pipelines/common.sh

display=
if [ "${1:-}" = "--display" ]; then
	display=1
	shift
fi
pool=${1:-gpu0}

xmem_choose_sink cuda-consumer.sh "$display" videoconvert ! autovideosink

xmem_pipelines_setup

if ! gst-inspect-1.0 cudadownload >/dev/null 2>&1; then
	echo "cuda-consumer.sh: cudadownload is not available: it needs gstreamer1.0-plugins-bad and a CUDA driver (libcuda.so.1)" >&2
	exit 77
fi
convert=()
if gst-inspect-1.0 cudaconvert >/dev/null 2>&1; then
	convert=(cudaconvert ! 'video/x-raw(memory:CUDAMemory),format=RGBA' !)
else
	echo "cuda-consumer.sh: cudaconvert is not available (no NVRTC): frames go to cudadownload as they are" >&2
fi

xmem_launch \
	xmemsrc pool-name="$pool" ${XMEM_NUM_BUFFERS:+num-buffers=$XMEM_NUM_BUFFERS} ${XMEM_POLICY:+policy=$XMEM_POLICY} \
	! 'video/x-raw(memory:CUDAMemory)' \
	! "${convert[@]}" cudadownload \
	! "${sink[@]}"
