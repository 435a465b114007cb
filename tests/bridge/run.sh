#!/usr/bin/env bash
# tests/bridge/run.sh srt|raw - pipelines/bridge-send.sh and bridge-receive.sh between two
# network namespaces joined by a veth pair, as two hosts: a videotestsrc producer and
# bridge-send in A, bridge-receive and a consumer of the far pool in B (consumer.py, which
# checks each frame's color: by plane means after H.264, byte for byte over raw RTP). Then
# the producer is killed and another started (90 frames, another color: the steady state,
# counted exactly), a third one and the link cut for 2.5 s, then the receiver killed and
# started again; after each the far consumer must receive again. Last, the producer killed, bridge-send must end within a few seconds of
# SIGINT (its EOS waits for a frame that never comes). Prints frames sent, received, lost
# (steady state, and in all from the scripts' exact final counts), and the latency the
# bridge adds: the median age of the steady producer's frames by their capture time at a
# consumer in B (carried across) and one in A (CLOCK_REALTIME, one kernel). Needs root (77 otherwise). meson sets XMEM_BUILD_DIR, XMEM_SKIP_SETUP and
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
elements=(srtsrc srtsink rtph264pay rtph264depay h264parse rtpvrawpay rtpvrawdepay udpsrc xmemsrc)
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
	for ns in "$ns_a" "$ns_b"; do
		ip netns pids "$ns" 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
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
colors=(0xff3366cc 0xffcc8833 0xff33cc66)
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
	setsid ip netns exec "$ns" env --default-signal=INT XDG_RUNTIME_DIR="$work/$side" "$@" >"$work/$name.log" 2>&1 &
	pids[$name]=$!
	started+=("$!")
}
# stop NAME [SECONDS]: SIGINT to NAME's process group, as Ctrl-C in a terminal; fails when
# it has not ended within SECONDS (default 10).
stop() {
	local limit=${2:-10} begun=$SECONDS
	kill -INT -- "-${pids[$1]}" 2>/dev/null || true
	while kill -0 "${pids[$1]}" 2>/dev/null; do
		if [ $((SECONDS - begun)) -ge "$limit" ]; then
			kill -KILL -- "-${pids[$1]}" 2>/dev/null || true
			fail "$transport: $1 did not end within $limit s of SIGINT"
		fi
		sleep 0.1
	done
	wait "${pids[$1]}" 2>/dev/null || true
}
# start_producer COLOR [FRAMES]: videotestsrc into pool A's "camera", endless or FRAMES
# frames; it publishes only once the sender and the near consumer are attached.
start_producer() {
	start producer "$ns_a" gst-launch-1.0 videotestsrc is-live=true pattern=solid-color \
		foreground-color="$1" ${2:+num-buffers=$2} \
		! video/x-raw,format=NV12,width=1280,height=720,framerate=30/1 \
		! xmemsink pool-name=camera wait-for-consumers=2 wait-timeout=20000000000
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
				{ grep -v '^frame ' "$log" || true; } | tail -n 15 >&2
			done
			fail "$transport: the far consumer got $(far_frames "$2") frames of color $2 ($3), wanted $1"
		fi
		sleep 0.3
	done
}

# wait_quiet: until the far consumer's log has not grown for 1.5 s (what was in flight
# has arrived).
wait_quiet() {
	local last=-1 now
	while now=$(far_frames) && [ "$now" -ne "$last" ]; do
		last=$now
		sleep 1.5
	done
}

export XMEM_SRT_LATENCY=${XMEM_SRT_LATENCY:-80}
start receiver "$ns_b" "$root/pipelines/bridge-receive.sh" "$port" far "${raw_flag[@]}"
start far "$ns_b" "$python" "$here/consumer.py" far "${colors[@]}"
start near "$ns_a" "$python" "$here/consumer.py" --capture-time camera "${colors[@]}"
start sender "$ns_a" "$root/pipelines/bridge-send.sh" camera 10.231.0.2:$port "${raw_flag[@]}"

# 1. Start, then the producer killed as a crash is (no EOS).
start_producer "${colors[0]}"
wait_far 20 0 "at the start"
kill -KILL -- "-${pids[producer]}"
wait "${pids[producer]}" 2>/dev/null || true

# 2. Steady state, counted exactly: a new producer of 90 frames (3 s), published only once
# the sender is attached again, then EOS.
steady_sent=90
# A consumer of the far pool through the Python library alone: each frame's capture_time.
library_frames=30
start library "$ns_b" "$python" "$here/library_consumer.py" far "$library_frames"
start_producer "${colors[1]}" "$steady_sent"
wait_far 20 1 "after the producer was restarted"
wait "${pids[producer]}" 2>/dev/null || true
wait_quiet
steady_received=$(far_frames 1)
wait "${pids[library]}" || fail "$transport: library_consumer.py failed: $(tail -n 3 "$work/library.log")"

# 3. A link cut: 2.5 s without the veth, with a live producer. The near consumer ended
# with the EOS: another one.
start near2 "$ns_a" "$python" "$here/consumer.py" --capture-time camera "${colors[@]}"
start_producer "${colors[2]}"
wait_far 20 2 "with a third producer"
before=$(far_frames 2)
ip -n "$ns_a" link set "$dev_a" down
sleep 2.5
ip -n "$ns_a" link set "$dev_a" up
wait_far $((before + 20)) 2 "after the link was cut for 2.5 s"
# 4. The receiver crashes (SIGKILL: its pool's owner dies) and is started again: the far
# consumer re-attaches to the new pool by itself (xmemsrc reconnect), the sender's
# stream resumes (SRT: it connects again; raw RTP: the datagrams find the new socket).
# Its gst-launch-1.0 runs in a session of its own (bridge-common.sh): killed with it, as a
# crashed host or container takes both.
mapfile -t receiving < <(ip netns pids "$ns_b" | while read -r pid; do
	tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q '^gst-launch-1.0 .*xmemsink' && echo "$pid"
done || true)
[ ${#receiving[@]} -gt 0 ] || fail "$transport: no receiving gst-launch-1.0 in B"
kill -KILL -- "-${pids[receiver]}" "${receiving[@]}"
wait "${pids[receiver]}" 2>/dev/null || true
wait_quiet
far_before_restart=$(far_frames)
before=$(far_frames 2)
start receiver2 "$ns_b" "$root/pipelines/bridge-receive.sh" "$port" far "${raw_flag[@]}"
wait_far $((before + 20)) 2 "after the receiver was killed and started again"

# 5. The producer gone, then the sender stopped: its EOS waits for a frame that never
# comes; it must end within a few seconds all the same.
kill -KILL -- "-${pids[producer]}"
wait "${pids[producer]}" 2>/dev/null || true
begun=$SECONDS
stop sender 8
sender_stop_s=$((SECONDS - begun))
wait_quiet
stop receiver2 8
for name in near2 far; do
	kill -TERM -- "-${pids[$name]}" 2>/dev/null || true # the EOS may have ended it
	wait "${pids[$name]}" 2>/dev/null || true
done

# The scripts' exact counts (their last line).
count() {
	grep -o "$1 [0-9]*\$" "$work/$2.log" | tail -n 1 | grep -o '[0-9]*$' || true
}
sent=$(count 'bridge-send: sent' sender)
received=$(count 'bridge-receive: received' receiver2)
far=$(far_frames)
unmatched=$(far_frames -1)
exact=$(grep -c '^frame [0-9]* [012] 1 ' "$work/far.log" || true)
# Latency, from each frame's capture time (its timestamp/x-ntp, which the far frames got
# across the bridge and the near consumer from its own pool): the median age at the far
# consumer in B and at the near one in A, over the steady producer's frames (one kernel,
# one clock), and what the bridge adds.
# median_ms: the median of the ages (ns, one a line) on its input, in ms; -1 for none.
median_ms() {
	sort -n | awk '{ a[NR] = $1 } END { if (NR) printf "%d", a[int((NR + 1) / 2)] / 1000000; else print -1 }'
}
# steady_ages NAME: the ages NAME's consumer.py printed for the steady producer's frames.
steady_ages() {
	grep "^frame [0-9]* 1 " "$work/$1.log" | awk '$5 >= 0 { print $5 }'
}
far_age_ms=$(steady_ages far | median_ms)
near_age_ms=$(steady_ages near | median_ms)
latency_ms=$((far_age_ms - near_age_ms))
stamped=$(awk '/^frame / && $5 >= 0' "$work/far.log" | wc -l)
library_stamped=$(awk '$1 == "age" && $2 >= 0' "$work/library.log" | wc -l)
library_age_ms=$(awk '$1 == "age" && $2 >= 0 { print $2 }' "$work/library.log" | median_ms)
steady_lost=$((steady_sent - steady_received))
echo "$transport 720p30: steady state: sent $steady_sent, received $steady_received, lost $steady_lost;" \
	"in all (a producer crash and restart, a 2.5 s link cut, a receiver crash and restart):" \
	"sent $sent (bridge-send), received $received (the restarted bridge-receive), $far at the" \
	"far consumer ($((far - far_before_restart)) after the restart), lost $((sent - far))" \
	"($unmatched of no test color, $exact byte-exact, $stamped with their capture time);" \
	"capture to consumer (median, steady state): ${far_age_ms} ms across the bridge, ${near_age_ms} ms" \
	"in A's pool, added latency ${latency_ms} ms; a library consumer in B: $library_stamped of" \
	"$library_frames frames with their capture_time, median age ${library_age_ms} ms;" \
	"bridge-send stopped with no producer in ${sender_stop_s} s"

[ "${sent:-0}" -gt 0 ] || fail "no frames counted as sent"
[ "${received:-0}" -gt 0 ] || fail "no frames counted (sent $sent, received $received)"
[ $((unmatched * 10)) -le "$far" ] || fail "$unmatched of $far far frames match neither color"
if [ "$transport" = raw ]; then
	[ $((exact * 10)) -ge $((far * 9)) ] || fail "only $exact of $far raw frames are byte-exact"
fi
# Every far frame carries its capture time across (it rides in every frame's first packet).
[ $((stamped * 10)) -ge $((far * 9)) ] || fail "only $stamped of $far far frames carry their capture time"
[ "$near_age_ms" -ge 0 ] && [ "$far_age_ms" -gt "$near_age_ms" ] ||
	fail "capture ages: ${far_age_ms} ms far, ${near_age_ms} ms near"
# The far pool's frames carry it for the library too (xmemsink's capture_time).
[ "$library_stamped" -eq "$library_frames" ] ||
	fail "$library_stamped of $library_frames frames had a capture_time in the far pool"
[ "$library_age_ms" -gt "$near_age_ms" ] && [ "$library_age_ms" -lt 5000 ] ||
	fail "a library consumer's capture ages: median ${library_age_ms} ms"
[ "$latency_ms" -lt 5000 ] || fail "the bridge added ${latency_ms} ms"
# Steady state on a veth: over raw RTP nothing is lost on an idle machine. Raw RTP has no
# retransmission: on a busy machine (a sanitizer's build, a second suite) the receiver,
# starved of CPU, loses datagrams, or its jitter buffer (50 ms) gives up on late ones, and
# the frame is gone (1 to 12 of 90 seen here under AddressSanitizer beside a compiling
# suite, while the far consumer's pool dropped none for it), hence up to 15. Over
# SRT the producer's EOS also ends the sender's stream, and srtsink closes its socket at
# EOS: what SRT still held back for its latency does not arrive (4 at 80 ms here), so
# twice that latency's worth more. The link cut loses what was sent while the link was
# down (2.5 s, 75 frames), the receiver's crash what was sent until it listened again,
# and a few more on each restart.
steady_bound=15
if [ "$transport" = srt ]; then
	steady_bound=$((15 + 2 * 30 * XMEM_SRT_LATENCY / 1000))
fi
if [ "$steady_lost" -lt 0 ] || [ "$steady_lost" -gt "$steady_bound" ]; then
	fail "steady state: $steady_lost of $steady_sent frames lost (at most $steady_bound)"
fi
[ $((far - far_before_restart)) -le "$received" ] ||
	fail "after the restart the far consumer got $((far - far_before_restart)) frames, more than the $received published"
# Over SRT the sender notices a receiver that died only after SRT's peer idle timeout (5 s)
# and its reconnection: what it sent until then is lost as well, 150 to 550 frames seen on
# Debian 12 and 13. So over SRT the loss in all is reported, not bounded: the steady phase
# above bounds SRT's own losses, and each step's wait_far bounds how long the stream is down.
if [ "$transport" = raw ] && [ $((sent - far)) -gt 200 ]; then
	fail "$((sent - far)) of $sent frames lost in all (at most 200)"
fi
[ $((sent - far)) -ge 0 ] || fail "the far consumer got $far frames, more than the $sent sent"
echo "PASS: $transport"
