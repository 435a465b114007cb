#!/usr/bin/env bash
# tests/pipelines/run.sh CASE - runs the scripts of pipelines/ exactly as a user does, with
# num-buffers and fakesink, each in its own process, and checks what every consumer got.
#   CASE: producer-consumer, display, decode-file, fanout, demo, cuda, cuda-file or infer
# The scripts' overrides (XMEM_NUM_BUFFERS, XMEM_SINK, ...) are listed in pipelines/common.sh;
# meson sets XMEM_BUILD_DIR, XMEM_SKIP_SETUP and GST_PLUGIN_PATH.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
pipelines=$root/pipelines
work=$(mktemp -d)
# A private pool directory: pools of other tests or of the user are never seen.
export XDG_RUNTIME_DIR=$work/run
mkdir -m 700 "$XDG_RUNTIME_DIR"

# Each command runs in a session of its own, so that what it started goes with it.
started=()
cleanup() {
	local pid
	for pid in "${started[@]}"; do
		kill -KILL -- "-$pid" 2>/dev/null || true
	done
	rm -rf "$work"
}
trap cleanup EXIT

fail() {
	echo "FAIL: $*" >&2
	exit 1
}

# Frames per consumer, and per producer (enough for a consumer that attaches late).
consumer_frames=30
producer_frames=120

# start NAME COMMAND...: runs COMMAND in the background, output in $work/NAME.log.
declare -A pids
start() {
	local name=$1
	shift
	setsid "$@" >"$work/$name.log" 2>&1 &
	pids[$name]=$!
	started+=("$!")
}

# A consumer's environment: fakesink reports every buffer (-v prints it).
consumer_env=(env "XMEM_NUM_BUFFERS=$consumer_frames" "XMEM_SINK=fakesink silent=false" XMEM_GST_ARGS=-v)

show_log() {
	echo "--- $1.log (last 20 lines)" >&2
	tail -n 20 "$work/$1.log" >&2
}

# finish NAME [SECONDS]: waits for NAME's process, which must end by itself with status 0.
finish() {
	local name=$1 limit=${2:-120} pid=${pids[$1]} rc=0
	local deadline=$((SECONDS + limit))
	while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do
		sleep 0.2
	done
	if kill -0 "$pid" 2>/dev/null; then
		kill -KILL -- "-$pid" 2>/dev/null || true
		show_log "$name"
		fail "$name did not end within ${limit}s"
	fi
	wait "$pid" || rc=$?
	if [ $rc -ne 0 ]; then
		show_log "$name"
		fail "$name exited with status $rc"
	fi
}

# frames LOG [PREFIX]: the buffers that reached fakesink, from its -v messages.
frames() {
	grep "^${2:-}" "$work/$1.log" | grep -c 'last-message = chain' || true
}

# expect_frames NAME COUNT [PREFIX LABEL]: lines of NAME's log starting with PREFIX.
expect_frames() {
	local got label=${4:-$1}
	got=$(frames "$1" "${3:-}")
	if [ "$got" -ne "$2" ]; then
		show_log "$1"
		fail "$label: $got frames reached fakesink, expected $2"
	fi
	echo "ok: $label received $got frames"
}

# Every pool ended cleanly: no socket left in the private directory.
expect_no_pools() {
	local left
	left=$(find "$XDG_RUNTIME_DIR" -type s)
	[ -z "$left" ] || fail "pool sockets left behind: $left"
	echo "ok: no pool socket left"
}

nv12_720p='format=(string)NV12, width=(int)1280, height=(int)720'

# producer.sh and consumer.sh: two consumers, each its own process, then the producer.
case_producer_consumer() {
	start consumer1 "${consumer_env[@]}" "$pipelines/consumer.sh" pc
	start consumer2 "${consumer_env[@]}" "$pipelines/consumer.sh" pc
	start producer env XMEM_NUM_BUFFERS=$producer_frames "$pipelines/producer.sh" pc
	finish consumer1
	finish consumer2
	finish producer
	expect_frames consumer1 $consumer_frames
	expect_frames consumer2 $consumer_frames
	grep -q "xmemsrc0.GstPad:src: caps = video/x-raw, $nv12_720p" "$work/consumer1.log" ||
		fail "consumer1 did not get the producer's caps"
	grep -q 'xmemsink pool-name=pc$' "$work/producer.log" || fail "producer.sh did not print its launch line"
	expect_no_pools
}

# display.sh: its line with fakesink in place of autovideosink; then, with no display
# at all, the fallback to fakesink and the message that says so.
case_display() {
	start shown "${consumer_env[@]}" "$pipelines/display.sh" disp
	start headless env -u DISPLAY -u WAYLAND_DISPLAY XMEM_NUM_BUFFERS=$consumer_frames XMEM_GST_ARGS=-v \
		"$pipelines/display.sh" disp
	start producer env XMEM_NUM_BUFFERS=$producer_frames "$pipelines/producer.sh" disp
	finish shown
	finish headless
	finish producer
	expect_frames shown $consumer_frames
	grep -q 'autovideosink' "$work/shown.log" && fail "XMEM_SINK did not replace autovideosink"
	grep -q 'no display' "$work/headless.log" || { show_log headless; fail "no message about the missing display"; }
	grep -q "xmemsrc0.GstPad:src: caps = video/x-raw, $nv12_720p" "$work/headless.log" ||
		{ show_log headless; fail "the fallback consumer got no stream"; }
	echo "ok: without a display, display.sh says so and falls back to fakesink"
	expect_no_pools
}

# decode-file.sh on a 2 s Theora file made here: one consumer takes 30 frames, the other
# stays to the end of the file and must see its last frame and the end of the stream.
case_decode_file() {
	local clip=$work/clip.ogg
	gst-launch-1.0 -q videotestsrc num-buffers=60 ! video/x-raw,width=320,height=240,framerate=30/1 \
		! theoraenc ! oggmux ! filesink location="$clip" || fail "cannot make the test file"
	start consumer1 "${consumer_env[@]}" "$pipelines/consumer.sh" movie
	start consumer2 env "XMEM_SINK=fakesink silent=false" XMEM_GST_ARGS=-v "$pipelines/consumer.sh" movie
	start producer env XMEM_WAIT_FOR_CONSUMERS=2 "$pipelines/decode-file.sh" "$clip" movie
	finish producer
	finish consumer1
	finish consumer2 30
	expect_frames consumer1 $consumer_frames
	local last
	last=$(grep 'last-message = chain' "$work/consumer2.log" | grep -o 'offset: [0-9]*' | tail -n 1)
	[ "$last" = "offset: 60" ] || { show_log consumer2; fail "consumer2's last frame: '$last', expected offset 60"; }
	echo "ok: consumer2 received $(frames consumer2) of 60 frames, the last one included, then EOS"
	expect_no_pools
}

# fanout.sh with 3 consumers, beside producer.sh.
case_fanout() {
	start fanout "${consumer_env[@]}" "$pipelines/fanout.sh" fan 3
	start producer env XMEM_NUM_BUFFERS=$producer_frames "$pipelines/producer.sh" fan
	finish fanout
	finish producer
	local i
	for i in 1 2 3; do
		expect_frames fanout $consumer_frames "\[consumer $i\] " "fanout consumer $i"
	done
	expect_no_pools
}

# demo.sh itself, shorter: it must end by itself with status 0 and report both consumers.
case_demo() {
	local n=90
	start demo env DEMO_FRAMES=$n "$pipelines/demo.sh"
	finish demo 120
	local log=$work/demo.log
	cat "$log"
	grep -Eq '^ +[0-9]+s +[0-9.]+ fps +[0-9]+ dropped +[0-9.]+ fps +[0-9]+ dropped$' "$log" ||
		fail "no per-second line"
	local name got dropped
	for name in A B; do
		read -r got dropped < <(sed -n "s/^consumer $name: \([0-9]*\) of $n frames, \([0-9]*\) dropped, [0-9.]* fps$/\1 \2/p" "$log")
		[ -n "${got:-}" ] || fail "no final line for consumer $name"
		[ "$got" -gt 0 ] || fail "consumer $name received nothing"
		[ $((got + dropped)) -eq $n ] || fail "consumer $name: $got received and $dropped dropped of $n"
	done
	grep -q '^done: ' "$log" || fail "demo.sh did not say it finished cleanly"
	expect_no_pools
}

# needs ELEMENT...: the case is skipped (77) unless every ELEMENT is registered.
needs() {
	local e
	for e in "$@"; do
		if ! gst-inspect-1.0 "$e" >/dev/null 2>&1; then
			echo "skipped: $e is not available (nvcodec needs gstreamer1.0-plugins-bad and a CUDA driver)"
			exit 77
		fi
	done
}

# cuda-producer.sh's test pattern, uploaded into a device pool, and two cuda-consumer.sh
# taking it as CUDA memory. In CI on the CUDA driver simulator (meson puts it first on
# LD_LIBRARY_PATH, so nvcodec's upload and download run on it too); on a GPU, for real.
case_cuda() {
	needs cudaupload cudadownload
	start consumer1 "${consumer_env[@]}" "$pipelines/cuda-consumer.sh" gpu
	start consumer2 "${consumer_env[@]}" "$pipelines/cuda-consumer.sh" gpu
	start producer env XMEM_NUM_BUFFERS=$producer_frames "$pipelines/cuda-producer.sh" gpu
	finish consumer1
	finish consumer2
	finish producer
	expect_frames consumer1 $consumer_frames
	expect_frames consumer2 $consumer_frames
	grep -q "xmemsrc0.GstPad:src: caps = video/x-raw(memory:CUDAMemory), $nv12_720p" "$work/consumer1.log" ||
		{ show_log consumer1; fail "consumer1 did not take CUDA memory with the producer's caps"; }
	grep -q "xmemsink pool-name=gpu$" "$work/producer.log" || fail "cuda-producer.sh did not print its launch line"
	expect_no_pools
}

# cuda-producer.sh --file: an H.264 file made here, decoded by nvh264dec into a device
# pool, taken by cuda-consumer.sh to its end. Needs a GPU with NVDEC.
case_cuda_file() {
	needs nvh264dec cudadownload
	local clip=$work/clip.mp4 enc
	for enc in nvh264enc x264enc openh264enc; do
		gst-inspect-1.0 "$enc" >/dev/null 2>&1 && break
		enc=
	done
	[ -n "$enc" ] || { echo "skipped: no H.264 encoder (nvh264enc, x264enc, openh264enc)"; exit 77; }
	gst-launch-1.0 -q videotestsrc num-buffers=60 ! video/x-raw,format=I420,width=320,height=240,framerate=30/1 \
		! "$enc" ! h264parse ! mp4mux ! filesink location="$clip" || fail "cannot make the test file with $enc"
	# Every frame: the file decodes faster than the consumer takes frames, and the
	# pool's default drops the oldest queued ones; this consumer asks for all of them.
	start consumer env XMEM_POLICY=fifo "XMEM_SINK=fakesink silent=false" XMEM_GST_ARGS=-v \
		"$pipelines/cuda-consumer.sh" movie
	start producer env XMEM_WAIT_FOR_CONSUMERS=1 "$pipelines/cuda-producer.sh" --file "$clip" movie
	finish producer
	finish consumer 30
	local got
	got=$(frames consumer)
	[ "$got" -eq 60 ] || { show_log consumer; fail "the consumer got $got of 60 decoded frames"; }
	echo "ok: 60 frames decoded by nvh264dec reached the consumer through a device pool"
	expect_no_pools
}

# infer.sh for a few frames on the CPU: its producer and examples/python/infer.py.
case_infer() {
	"${XMEM_PYTHON:-/usr/bin/python3}" -c 'import torch' 2>/dev/null ||
		{ echo "skipped: ${XMEM_PYTHON:-/usr/bin/python3} has no torch (python3-torch)"; exit 77; }
	start infer env XMEM_POOL=infer "$pipelines/infer.sh" 20
	finish infer 180
	local log=$work/infer.log
	grep -q '^infer: 20 frames of 640x360 on cpu, ' "$log" || { show_log infer; fail "no final line for 20 frames"; }
	grep '^infer: ' "$log"
	expect_no_pools
}

case ${1:-} in
producer-consumer) case_producer_consumer ;;
display) case_display ;;
decode-file) case_decode_file ;;
fanout) case_fanout ;;
demo) case_demo ;;
cuda) case_cuda ;;
cuda-file) case_cuda_file ;;
infer) case_infer ;;
*)
	echo "usage: $0 producer-consumer|display|decode-file|fanout|demo|cuda|cuda-file|infer" >&2
	exit 2
	;;
esac
