#!/usr/bin/env bash
# pipelines/producer.sh [POOL] - a live test pattern published into the xmem pool POOL
# (default cam0) until Ctrl-C; watch it with pipelines/consumer.sh or display.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
. pipelines/common.sh
xmem_pipelines_setup

pool=${1:-cam0}

xmem_launch \
	videotestsrc is-live=true ${XMEM_NUM_BUFFERS:+num-buffers=$XMEM_NUM_BUFFERS} \
	! video/x-raw,format=NV12,width=1280,height=720,framerate=30/1 \
	! xmemsink pool-name="$pool"
