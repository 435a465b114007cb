#!/usr/bin/env bash
# pipelines/infer.sh [FRAMES] - a gst-launch-1.0 producer (a live 640x360 NV12 test
# pattern into pool "infer") and examples/python/infer.py taking its frames as torch
# tensors without a copy, running a small network on each, and printing frames per
# second and latency; FRAMES frames (default 300), then both stop. Uses Debian's
# /usr/bin/python3 (XMEM_PYTHON overrides), which needs python3-torch.
set -euo pipefail
cd "$(dirname "$0")/.."
. pipelines/common.sh
xmem_pipelines_setup

frames=${1:-300}
python=${XMEM_PYTHON:-/usr/bin/python3}
if ! "$python" -c 'import torch' 2>/dev/null; then
	echo "infer.sh: $python cannot import torch (install python3-torch)" >&2
	exit 77
fi
pool=${XMEM_POOL:-infer}

echo "+ gst-launch-1.0 videotestsrc is-live=true ! video/x-raw,format=NV12,width=640,height=360,framerate=30/1 ! xmemsink pool-name=$pool &" >&2
gst-launch-1.0 -q -e videotestsrc is-live=true \
	! video/x-raw,format=NV12,width=640,height=360,framerate=30/1 \
	! xmemsink pool-name="$pool" &
producer=$!
# Ctrl-C for gst-launch -e: end of stream, and the pool closes cleanly.
stop_producer() {
	kill -INT "$producer" 2>/dev/null || return 0
	for _ in $(seq 50); do
		kill -0 "$producer" 2>/dev/null || break
		sleep 0.1
	done
	kill -KILL "$producer" 2>/dev/null || true
	wait "$producer" 2>/dev/null || true
}
trap stop_producer EXIT

export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
export XMEM_LIBRARY=${XMEM_LIBRARY:-$(realpath "$XMEM_BUILD_DIR")/lib/libxmem.so.0}
echo "+ $python examples/python/infer.py $pool --frames $frames" >&2
"$python" examples/python/infer.py "$pool" --frames "$frames"
