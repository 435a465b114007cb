#!/usr/bin/env bash
# tests/examples/nvdec.sh MODE - examples/nvdec_producer.cpp (xmem-nvdec-producer) as a
# user runs it. MODE:
#   missing  without libnvcuvid.so.1: it must say so and exit 1 (77 where NVDEC exists)
#   sim      on the CUDA simulator and its NVDEC stub, which decodes nothing: it must get
#            through the driver's and NVDEC's loaders and stop at the first NVDEC call,
#            naming it (xmem's start-up on a strict driver, not NVDEC's behaviour)
#   gpu      on a GPU: an H.264 file made here, decoded into a device pool while a
#            GStreamer consumer takes every frame (77 without NVDEC or an encoder)
# meson sets XMEM_NVDEC_PRODUCER (the program) and, for sim, LD_LIBRARY_PATH.
set -euo pipefail
producer=${XMEM_NVDEC_PRODUCER:?set by meson}
work=$(mktemp -d)
export XDG_RUNTIME_DIR=$work/run
mkdir -m 700 "$XDG_RUNTIME_DIR"
trap 'rm -rf "$work"' EXIT

fail() {
	echo "FAIL: $*" >&2
	exit 1
}

has_nvcuvid() {
	ldconfig -p 2>/dev/null | grep -q 'libnvcuvid\.so\.1'
}

# An H.264 elementary stream of N frames, from whichever encoder GStreamer has.
make_clip() {
	local enc
	for enc in nvh264enc x264enc openh264enc; do
		if gst-inspect-1.0 "$enc" >/dev/null 2>&1; then
			gst-launch-1.0 -q videotestsrc num-buffers="$1" \
				! video/x-raw,format=I420,width=320,height=240,framerate=30/1 ! "$enc" \
				! h264parse ! video/x-h264,stream-format=byte-stream \
				! filesink location="$work/clip.h264" && return 0
		fi
	done
	return 1
}

# run ARGS...: the producer's status in $rc, its output in $work/out.log.
run() {
	rc=0
	"$producer" "$@" >"$work/out.log" 2>&1 || rc=$?
	cat "$work/out.log"
}

case ${1:-} in
missing)
	has_nvcuvid && { echo "skipped: this machine has libnvcuvid.so.1"; exit 77; }
	printf '\0\0\0\1' >"$work/clip.h264"
	run "$work/clip.h264" nv
	[ "$rc" -eq 1 ] || fail "exit status $rc, expected 1"
	grep -q 'cannot load libnvcuvid.so.1' "$work/out.log" || fail "no message naming libnvcuvid.so.1"
	echo "ok: without NVDEC it says so and exits 1"
	;;
sim)
	printf '\0\0\0\1' >"$work/clip.h264"
	run "$work/clip.h264" nv
	[ "$rc" -eq 1 ] || fail "exit status $rc, expected 1"
	grep -q 'cuvidGetDecoderCaps failed: CUDA_ERROR_NOT_SUPPORTED' "$work/out.log" ||
		fail "it did not reach NVDEC's first call on the simulator"
	echo "ok: through both loaders on the simulator, stopped at NVDEC's first call"
	;;
gpu)
	has_nvcuvid || { echo "skipped: no libnvcuvid.so.1 (NVDEC needs an NVIDIA GPU and driver)"; exit 77; }
	make_clip 60 || { echo "skipped: no H.264 encoder in GStreamer"; exit 77; }
	# policy=fifo: NVDEC decodes the clip far faster than the consumer takes frames,
	# and a consumer that asks for every frame gets it (the producer waits for it).
	# No -q: it silences -v's last-message lines, which are what is counted.
	gst-launch-1.0 xmemsrc pool-name=nv is-live=false policy=fifo timeout=30000000000 ! video/x-raw \
		! fakesink silent=false -v >"$work/consumer.log" 2>&1 &
	consumer=$!
	run "$work/clip.h264" nv --wait 1
	wait "$consumer" || fail "the consumer failed: $(tail -n 5 "$work/consumer.log")"
	[ "$rc" -eq 0 ] || fail "exit status $rc"
	grep -q '^xmem-nvdec-producer: 60 frames of 320x240 published' "$work/out.log" || fail "not 60 frames published"
	got=$(grep -c 'last-message = chain' "$work/consumer.log" || true)
	[ "$got" -eq 60 ] || fail "the consumer got $got of 60 frames"
	echo "ok: 60 frames decoded by NVDEC into a device pool reached a GStreamer consumer"
	;;
*)
	echo "usage: $0 missing|sim|gpu" >&2
	exit 2
	;;
esac
