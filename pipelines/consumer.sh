#!/usr/bin/env bash
# pipelines/consumer.sh [--display] [POOL] - attaches to the xmem pool POOL (default cam0)
# in this process and takes its frames: into fakesink, or onto the screen with --display.
set -euo pipefail
cd "$(dirname "$0")/.."
. pipelines/common.sh

display=
if [ "${1:-}" = "--display" ]; then
	display=1
	shift
fi
pool=${1:-cam0}

xmem_choose_sink consumer.sh "$display" autovideosink

xmem_pipelines_setup
xmem_launch \
	xmemsrc pool-name="$pool" ${XMEM_NUM_BUFFERS:+num-buffers=$XMEM_NUM_BUFFERS} \
	! videoconvert \
	! "${sink[@]}"
