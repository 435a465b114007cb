#!/usr/bin/env bash
# pipelines/decode-file.sh FILE [POOL] - decodes FILE (any format decodebin knows) straight
# into the xmem pool POOL (default movie), in real time, once a consumer is attached.
#   XMEM_WAIT_FOR_CONSUMERS=N  consumers to wait for before the first frame (default 1)
# A file ends by itself, so XMEM_NUM_BUFFERS does not apply here.
set -euo pipefail
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
	echo "usage: $0 FILE [POOL]" >&2
	exit 2
fi
file=$(realpath -- "$1")
[ -r "$file" ] || { echo "decode-file.sh: cannot read $1" >&2; exit 1; }
pool=${2:-movie}
wait=${XMEM_WAIT_FOR_CONSUMERS:-1}
cd "$(dirname "$0")/.."
. pipelines/common.sh
xmem_pipelines_setup

# Until then the streaming thread waits in xmemsink, where the EOS of a first Ctrl-C
# cannot reach it: a second Ctrl-C ends gst-launch-1.0.
if [ "$wait" -gt 0 ]; then
	echo "decode-file.sh: waiting for $wait consumer(s), e.g. pipelines/consumer.sh $pool (Ctrl-C twice to give up)" >&2
fi
xmem_launch \
	filesrc location="$file" \
	! decodebin \
	! videoconvert \
	! xmemsink pool-name="$pool" wait-for-consumers="$wait"
