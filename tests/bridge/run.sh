#!/usr/bin/env bash
# tests/bridge/run.sh srt|raw - pipelines/bridge-send.sh and bridge-receive.sh between two
# network namespaces joined by a veth pair, as two hosts: a videotestsrc producer and
# bridge-send in A, bridge-receive and a consumer of the far pool in B (consumer.py, which
# checks each frame's color: by plane means after H.264, byte for byte over raw RTP). Then
# the producer is restarted (with another color) and the link cut for 2.5 s; after each the
# far consumer must receive again. Prints frames sent, received, lost, and the latency the
# bridge adds: when the new color first reaches a consumer in A and one in B (CLOCK_REALTIME,
# one kernel). Needs root (77 otherwise). meson sets XMEM_BUILD_DIR, XMEM_SKIP_SETUP and
# GST_PLUGIN_PATH.
set -euo pipefail

transport=$1
root=$(cd "$(dirname "$0")/../.." && pwd)
here=$root/tests/bridge
python=${XMEM_PYTHON:-/usr/bin/python3}

skip() {
	echo "SKIP: $*"
	exit 77
}
fail() {
	echo "FAIL: $*" >&2
	exit 1
}

[ "$(id -u)" -eq 0 ] || skip "needs root to make network namespaces"
command -v ip >/dev/null || skip "no ip (iproute2)"
elements=(srtsrc srtsink tsdemux mpegtsmux h264parse rtpvrawpay rtpvrawdepay udpsrc xmemsrc)
for element in "${elements[@]}"; do
	gst-inspect-1.0 "$element" >/dev/null 2>&1 || skip "GStreamer element $element is missing"
done
gst-inspect-1.0 openh264enc >/dev/null 2>&1 || gst-inspect-1.0 x264enc >/dev/null 2>&1 ||
	gst-inspect-1.0 nvh264enc >/dev/null 2>&1 || skip "no H.264 encoder"
"$python" -c 'import gi, numpy' 2>/dev/null || skip "$python lacks gi or numpy"

ns_a=xmbA$$
ns_b=xmbB$$
dev_a=xmA$$
dev_b=xmB$$
work=$(mktemp -d)
started=()
cleanup() {
	local pid
	for pid in "${started[@]}"; do
		kill -KILL -- "-$pid" 2>/dev/null || true
	done
	ip netns del "$ns_a" 2>/dev/null || true
	ip netns del "$ns_b" 2>/dev/null || true
	if [ -n "${XMEM_BRIDGE_KEEP:-}" ]; then
		echo "logs kept in $work"
	else
		rm -rf "$work"
	fi
}
trap cleanup EXIT

ip netns add "$ns_a" || skip "cannot make a network namespace"
ip netns add "$ns_b" || skip "cannot make a network namespace"
ip link add "$dev_a" type veth peer name "$dev_b" || skip "cannot make a veth pair"
ip link set "$dev_a" netns "$ns_a"
ip link set "$dev_b" netns "$ns_b"
ip -n "$ns_a" addr add 10.231.0.1/24 dev "$dev_a"
ip -n "$ns_b" addr add 10.231.0.2/24 dev "$dev_b"
for ns in "$ns_a" "$ns_b"; do
	ip -n "$ns" link set lo up
done
ip -n "$ns_a" link set "$dev_a" up
ip -n "$ns_b" link set "$dev_b" up

# Each side its own pool directory, as two hosts have.
mkdir -m 700 "$work/run-a" "$work/run-b"
colors=(0xff3366cc 0xffcc8833)
port=5000
raw_flag=()
if [ "$transport" = raw ]; then
	raw_flag=(--raw)
fi

# start NAME NS COMMAND...: COMMAND in namespace NS, in a session of its own, output in
# $work/NAME.log.
declare -A pids
start() {
	local name=$1 ns=$2 side
	shift 2
	side=run-a
	[ "$ns" = "$ns_b" ] && side=run-b
	setsid ip netns exec "$ns" env XDG_RUNTIME_DIR="$work/$side" "$@" >"$work/$name.log" 2>&1 &
	pids[$name]=$!
	started+=("$!")
}
stop() {
	kill -INT -- "-${pids[$1]}" 2>/dev/null || true
	local deadline=$((SECONDS + 15))
	while kill -0 "${pids[$1]}" 2>/dev/null && [ $SECONDS -lt $deadline ]; do
		sleep 0.2
	done
	kill -KILL -- "-${pids[$1]}" 2>/dev/null || true
	wait "${pids[$1]}" 2>/dev/null || true
}
start_producer() {
	# No -e: a restart without EOS, as a crash or a kill is; consumers wait for the new owner.
	start producer "$ns_a" gst-launch-1.0 videotestsrc is-live=true pattern=solid-color \
		foreground-color="$1" ! video/x-raw,format=NV12,width=1280,height=720,framerate=30/1 \
		! xmemsink pool-name=camera
}
# far_frames [MATCH]: frames the far consumer got (of color MATCH).
far_frames() {
	if [ $# -eq 0 ]; then
		grep -c '^frame ' "$work/far.log" || true
	else
		grep -c "^frame [0-9]* $1 " "$work/far.log" || true
	fi
}
# wait_far COUNT MATCH WHAT: until the far consumer has COUNT frames of MATCH, 40 s at most.
wait_far() {
	local deadline=$((SECONDS + 40))
	while [ "$(far_frames "$2")" -lt "$1" ]; do
		if [ $SECONDS -ge $deadline ]; then
			for log in "$work"/*.log; do
				echo "--- $(basename "$log") (last 15 lines)" >&2
				grep -v '^frame ' "$log" | tail -n 15 >&2
			done
			fail "$transport: the far consumer got $(far_frames "$2") frames of color $2 ($3), wanted $1"
		fi
		sleep 0.3
	done
}

export XMEM_SRT_LATENCY=${XMEM_SRT_LATENCY:-80}
start receiver "$ns_b" "$root/pipelines/bridge-receive.sh" "$port" far "${raw_flag[@]}"
start far "$ns_b" "$python" "$here/consumer.py" far "${colors[@]}"
start_producer "${colors[0]}"
start near "$ns_a" "$python" "$here/consumer.py" camera "${colors[@]}"
start sender "$ns_a" "$root/pipelines/bridge-send.sh" camera 10.231.0.2:$port "${raw_flag[@]}"
wait_far 20 0 "at the start"

stop producer
start_producer "${colors[1]}"
wait_far 20 1 "after the producer restarted"

before=$(far_frames 1)
ip -n "$ns_a" link set "$dev_a" down
sleep 2.5
ip -n "$ns_a" link set "$dev_a" up
wait_far $((before + 20)) 1 "after the link was cut for 2.5 s"

# The sender first: its EOS (-e) waits for a frame while its pool has no producer.
stop sender
stop producer
stop receiver
stop near
stop far

sent=$(grep -o 'bridge-send: sent [0-9]*' "$work/sender.log" | tail -n 1 | grep -o '[0-9]*$')
received=$(grep -o 'bridge-receive: received [0-9]*' "$work/receiver.log" | tail -n 1 | grep -o '[0-9]*$')
far=$(far_frames)
unmatched=$(far_frames -1)
exact=$(grep -c '^frame [0-9]* [01] 1$' "$work/far.log" || true)
# Latency: the first frame of the second color in A's pool and in B's.
first_ns() {
	grep -m 1 "^frame [0-9]* 1 " "$work/$1.log" | cut -d ' ' -f 2
}
latency_ms=$((($(first_ns far) - $(first_ns near)) / 1000000))
echo "$transport 720p30: sent $sent, received $received, lost $((sent - received)) in the bridge;" \
	"far consumer $far frames ($unmatched of neither color, $exact byte-exact);" \
	"added latency ${latency_ms} ms (first frame of the restarted producer, A's pool to B's)"

[ "${sent:-0}" -gt 0 ] || fail "no frames counted as sent"
[ "${received:-0}" -gt 0 ] || fail "no frames counted (sent $sent, received $received)"
[ $((unmatched * 10)) -le "$far" ] || fail "$unmatched of $far far frames match neither color"
if [ "$transport" = raw ]; then
	[ $((exact * 10)) -ge $((far * 9)) ] || fail "only $exact of $far raw frames are byte-exact"
fi
[ "$latency_ms" -lt 5000 ] || fail "the bridge added ${latency_ms} ms"
echo "PASS: $transport"
