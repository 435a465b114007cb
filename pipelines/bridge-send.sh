#!/usr/bin/env bash
# pipelines/bridge-send.sh POOL HOST:PORT [--raw] - takes the frames of the xmem pool POOL
# and sends them to HOST, where pipelines/bridge-receive.sh PORT POOL2 publishes them in
# a pool of that host, until Ctrl-C.
#   default: H.264 in RTP over SRT (caller; each RTP packet one SRT message): nvh264enc
#            where it runs, else x264enc, else openh264enc. XMEM_SRT_LATENCY=ms sets SRT's
#            latency (default 125) and XMEM_BRIDGE_BITRATE=kbit/s the encoder's (default
#            8000).
#   --raw:   uncompressed RTP (RFC 4175, rtpvrawpay, I420) over UDP: for a fast LAN; the
#            receiver must be told the size (XMEM_BRIDGE_WIDTH/HEIGHT).
# What crosses: the pixels, the frame order and each frame's capture time: its producer's
# timestamp as a GstReferenceTimestampMeta timestamp/x-ntp (xmemsrc
# add-reference-timestamp-meta; a camera's or RTSP source's own is kept), in an RTP header
# extension on every packet (the xmem plugin's xmemrtphdrextcapture: RFC 6051's 64-bit NTP
# timestamp, which GStreamer's own extension puts only on a frame's first packet, where
# GStreamer before 1.24 does not read it). On the far host it is again a timestamp/x-ntp meta on each
# frame the far pool's consumers take with xmemsrc: their frame's age is their realtime
# clock less it (hosts synchronized by NTP or PTP). Not kept: pts (RTP restamps; the far
# pool stamps frames with its own clock on arrival).
# The sender restarts within a second whenever its pipeline ends (the receiver went away,
# the network dropped); it prints the frames it sent ("bridge-send: sent N") every 10 s
# and, exactly, at the end. Ctrl-C or SIGTERM ends the stream with EOS and, should that
# wait for a frame that never comes (no producer in POOL), stops the pipeline after
# XMEM_BRIDGE_STOP_GRACE seconds (default 3).
set -euo pipefail
cd "$(dirname "$0")/.."
. pipelines/common.sh
. pipelines/bridge-common.sh

if [ $# -lt 2 ] || [[ $2 != *:* ]]; then
	echo "usage: pipelines/bridge-send.sh POOL HOST:PORT [--raw]" >&2
	exit 2
fi
pool=$1
host=${2%:*}
port=${2##*:}
raw=
if [ "${3:-}" = "--raw" ]; then
	raw=1
fi

xmem_pipelines_setup

# element_works DESCRIPTION: the element is installed and encodes a frame here (nvh264enc
# is installed on machines without an NVIDIA GPU, and fails there only when it starts).
element_works() {
	gst-inspect-1.0 "${1%% *}" >/dev/null 2>&1 &&
		timeout 20 gst-launch-1.0 -q videotestsrc num-buffers=2 ! video/x-raw,width=320,height=240 \
			! videoconvert ! "$1" ! fakesink >/dev/null 2>&1
}

bitrate=${XMEM_BRIDGE_BITRATE:-8000}
# An RTP header extension carries each frame's capture time (see above).
capture_extension="extmap-1=(string)urn:xmem:rtp-hdrext:capture-time"
if [ -n "$raw" ]; then
	tail=(videoconvert ! "video/x-raw,format=I420"
		! rtpvrawpay mtu=1400 ! "application/x-rtp,$capture_extension"
		! udpsink host="$host" port="$port" sync=false)
else
	if element_works nvh264enc; then
		encoder=(nvh264enc preset=low-latency-hq zerolatency=true gop-size=30 bitrate="$bitrate")
	elif element_works x264enc; then
		encoder=(x264enc tune=zerolatency speed-preset=veryfast key-int-max=30 bitrate="$bitrate")
	elif element_works openh264enc; then
		encoder=(openh264enc usage-type=camera complexity=low gop-size=30 bitrate="$((bitrate * 1000))")
	else
		echo "bridge-send.sh: no H.264 encoder works here (nvh264enc, x264enc, openh264enc)" >&2
		exit 1
	fi
	echo "bridge-send.sh: encoder ${encoder[0]}" >&2
	# SRT's live mode sends messages of at most 1316 bytes: an RTP packet, its header
	# extension included, fits one. SPS and PPS before every key frame, so a receiver
	# that starts again decodes from the next one.
	tail=(videoconvert ! "video/x-raw,format=I420" ! "${encoder[@]}"
		! h264parse ! rtph264pay mtu=1300 config-interval=-1 ! "application/x-rtp,$capture_extension"
		! srtsink uri="srt://$host:$port?mode=caller" latency="${XMEM_SRT_LATENCY:-125}"
		wait-for-connection=true sync=false)
fi
# identity prints one line per frame it passes (-v): awk counts them into "sent".
line=(xmemsrc pool-name="$pool" add-reference-timestamp-meta=true ${XMEM_NUM_BUFFERS:+num-buffers=$XMEM_NUM_BUFFERS}
	! identity name=bridge silent=false ! "${tail[@]}")
echo "+ gst-launch-1.0 -e -v -X seqnum -X timestamp -X stats ${line[*]}" >&2

xmem_bridge_run bridge-send sent 1 "${XMEM_NUM_BUFFERS:-}" "${line[@]}"
