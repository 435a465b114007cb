#!/usr/bin/env bash
# pipelines/bridge-receive.sh PORT POOL [--raw] - receives what pipelines/bridge-send.sh
# sends to PORT of this host and publishes it in the xmem pool POOL, until Ctrl-C.
#   default: SRT listener, H.264 in RTP, decoded by avdec_h264 (openh264dec without it).
#            XMEM_SRT_LATENCY=ms sets SRT's latency (default 125).
#   --raw:   RTP raw video (rtpvrawdepay) on UDP; XMEM_BRIDGE_WIDTH and XMEM_BRIDGE_HEIGHT
#            (default 1280x720) must be the sender's frame size.
# Each frame's capture time (the xmem plugin's RTP header extension) becomes its
# GstReferenceTimestampMeta timestamp/x-ntp again, which the pool carries to its consumers
# (xmemsrc adds it back): their frame's age is their realtime clock less it.
# The pool stays: when the sender goes away or the network drops, the receiving pipeline is
# started again within a second under the same pool name, and the pool's consumers re-attach
# to it (xmemsrc reconnect=true, the default). It prints the frames it published
# ("bridge-receive: received N") every 10 s and, exactly, at the end (Ctrl-C or SIGTERM).
set -euo pipefail
cd "$(dirname "$0")/.."
. pipelines/common.sh
. pipelines/bridge-common.sh

if [ $# -lt 2 ]; then
	echo "usage: pipelines/bridge-receive.sh PORT POOL [--raw]" >&2
	exit 2
fi
port=$1
pool=$2
raw=
if [ "${3:-}" = "--raw" ]; then
	raw=1
fi

xmem_pipelines_setup

capture_extension="extmap-1=(string)urn:xmem:rtp-hdrext:capture-time"
if [ -n "$raw" ]; then
	caps="application/x-rtp,media=video,clock-rate=90000,encoding-name=RAW,payload=96"
	caps+=",sampling=YCbCr-4:2:0,depth=(string)8,colorimetry=(string)BT601-5"
	caps+=",width=(string)${XMEM_BRIDGE_WIDTH:-1280},height=(string)${XMEM_BRIDGE_HEIGHT:-720},$capture_extension"
	head=(udpsrc port="$port" buffer-size=33554432 caps="$caps"
		! rtpjitterbuffer latency=50 ! rtpvrawdepay)
else
	if gst-inspect-1.0 avdec_h264 >/dev/null 2>&1; then
		decoder=avdec_h264
	elif gst-inspect-1.0 openh264dec >/dev/null 2>&1; then
		decoder=openh264dec
	else
		echo "bridge-receive.sh: no H.264 decoder here (avdec_h264, openh264dec)" >&2
		exit 1
	fi
	# SRT delivers the packets in order, late ones dropped: no jitter buffer.
	caps="application/x-rtp,media=video,clock-rate=90000,encoding-name=H264,payload=96,$capture_extension"
	head=(srtsrc uri="srt://:$port?mode=listener" latency="${XMEM_SRT_LATENCY:-125}" keep-listening=true
		! "$caps" ! rtph264depay ! h264parse ! "$decoder")
fi
# identity prints one line per frame it passes (-v): awk counts them into "received".
line=("${head[@]}" ! videoconvert ! "video/x-raw,format=NV12" ! identity name=bridge silent=false
	! xmemsink pool-name="$pool")
echo "+ gst-launch-1.0 -e -v -X seqnum -X timestamp -X stats ${line[*]}" >&2

xmem_bridge_run bridge-receive received 0.5 "" "${line[@]}"
