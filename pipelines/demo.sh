#!/usr/bin/env bash
# pipelines/demo.sh - the README's first command: one producer and two consumers, each a
# gst-launch-1.0 process, sharing frames through an xmem pool; ends by itself.
#   DEMO_FRAMES=N       frames the producer sends (default 180: 6 s at 30 fps)
#   XMEM_FROM_SOURCE=1  build this tree even where its packages are installed
set -euo pipefail
cd "$(dirname "$0")/.."
. pipelines/common.sh
# Installed packages of this version run the demo at once; otherwise it builds the tree.
xmem_use_installed gstreamer1.0-tools gstreamer1.0-plugins-base || xmem_pipelines_setup "${XMEM_DEMO_PACKAGES[@]}"

frames=${DEMO_FRAMES:-180}
pool="xmem-demo-$$"
logs=$(mktemp -d)

echo "xmem demo: pool $pool, $frames frames of 640x480 NV12 at 30 fps, three processes"
echo "consumer A keeps up; consumer B spends 50 ms on each frame, so the pool drops B's"
echo "oldest queued frames (policy drop-oldest) instead of slowing down A or the producer"
echo

# Consumers first; the producer holds its first frame until both are attached. The
# consumers' fakesinks report every buffer (-v), so their logs count what arrived.
gst-launch-1.0 -e -v xmemsrc pool-name="$pool" name=A ! fakesink silent=false sync=false >"$logs/A" 2>&1 &
consumer_a=$!
gst-launch-1.0 -e -v xmemsrc pool-name="$pool" name=B ! identity sleep-time=50000 ! fakesink silent=false sync=false >"$logs/B" 2>&1 &
consumer_b=$!
gst-launch-1.0 -e videotestsrc is-live=true num-buffers="$frames" \
	! video/x-raw,format=NV12,width=640,height=480,framerate=30/1 \
	! xmemsink pool-name="$pool" wait-for-consumers=2 >"$logs/producer" 2>&1 &
producer=$!
running=("$producer" "$consumer_a" "$consumer_b") # until waited for

# alive PID...: true while any of them runs.
alive() {
	kill -0 "$@" 2>/dev/null
}

# linger SECONDS PID...: waits up to SECONDS for all of them to end; false if some still run.
linger() {
	local tenths=$(($1 * 10))
	shift
	while alive "$@" && [ $tenths -gt 0 ]; do
		sleep 0.1
		tenths=$((tenths - 1))
	done
	! alive "$@"
}

# reap PID: its exit status, waiting again when a trapped signal cuts the wait short.
reap() {
	local rc
	while :; do
		wait "$1" && return 0
		rc=$?
		[ $rc -gt 128 ] && alive "$1" && continue
		return $rc
	done
}

# Ctrl-C reaches the three gst-launch-1.0 -e processes too: the producer ends the stream
# (EOS), the consumers drain it, and the demo ends as usual. A TERM sent to this script
# alone is passed on to the producer as that interrupt.
interrupted=
trap 'interrupted=1' INT
trap 'interrupted=1; kill -INT "$producer" 2>/dev/null || true' TERM

# On a failure, what still runs: it gets time to end by itself, then an interrupt
# (gst-launch-1.0 -e sends EOS), then TERM (a producer still waiting for its consumers).
# shellcheck disable=SC2317 # run by the trap
cleanup() {
	if [ ${#running[@]} -gt 0 ]; then
		linger 2 "${running[@]}" || { kill -INT "${running[@]}" 2>/dev/null; linger 3 "${running[@]}"; } ||
			kill -TERM "${running[@]}" 2>/dev/null || true
	fi
	rm -rf "$logs"
}
trap cleanup EXIT

# show_failure NAME: the end of NAME's log.
show_failure() {
	echo "$1 failed; the end of its output:"
	tail -n 5 "$logs/$1" | sed 's/^/  /'
}

# "name received dropped" for each consumer, as the pool counts them.
counters() {
	"$XMEM_INSPECT" "$pool" --json 2>/dev/null |
		grep -o '"client":"[^"]*"\|"received":[0-9]*\|"dropped":[0-9]*' |
		awk -F: '/"client"/ { gsub(/"/, "", $NF); name = $NF }
			/"received"/ && name != "" { received = $2 }
			/"dropped"/ && name != "" { print name, received, $2 }'
}

# Reads the pool's counters into got[NAME] and lost[NAME]; false until both are attached.
declare -A got lost before
sample() {
	got=() lost=()
	local name received dropped
	while read -r name received dropped; do
		got[$name]=$received
		lost[$name]=$dropped
	done < <(counters)
	[ -n "${got[A]:-}" ] && [ -n "${got[B]:-}" ]
}

# cell NAME NOW: frames per second that NAME took since the last look, and its drops so far.
cell() {
	awk -v n=$((got[$1] - before[$1])) -v ns=$(($2 - then)) -v d="${lost[$1]}" \
		'BEGIN { printf "%5.1f fps %5d dropped", n * 1e9 / ns, d }'
}

until sample; do
	[ -z "$interrupted" ] || exit 130
	for name in A B; do
		pid=$consumer_a
		[ $name = B ] && pid=$consumer_b
		alive "$pid" || { show_failure "$name"; exit 1; }
	done
	alive "$producer" || { show_failure producer; exit 1; }
	sleep 0.1
done
then=$(date +%s%N)
before=([A]=${got[A]} [B]=${got[B]})

# Once a second while the producer runs.
printf '%5s   %-25s%s\n' time "consumer A" "consumer B"
seconds=0
while sleep 1 && alive "$producer"; do
	sample || continue
	now=$(date +%s%N)
	seconds=$((seconds + 1))
	printf '%4ds  %s  %s\n' "$seconds" "$(cell A "$now")" "$(cell B "$now")"
	then=$now
	before=([A]=${got[A]} [B]=${got[B]})
done

status=0
[ -z "$interrupted" ] || echo "interrupted: ending the stream early"
reap "$producer" || { show_failure producer; status=1; }
# The consumers drain what is queued for them, then see the end of the stream.
if ! linger 10 "$consumer_a" "$consumer_b"; then
	echo "a consumer did not see the end of the stream; interrupting it"
	kill -INT "$consumer_a" "$consumer_b" 2>/dev/null || true
	status=1
fi
reap "$consumer_a" || { show_failure A; status=1; }
reap "$consumer_b" || { show_failure B; status=1; }
running=()

# Totals from the consumers' side: the buffers that reached each fakesink, out of the
# frames published (the last one's sequence number: it is never dropped), and their rate
# over the stream time they span (first to last timestamp).
echo
for name in A B; do
	grep 'last-message = chain' "$logs/$name" | grep -o 'pts: [0-9:.]*\|offset: [0-9]*' |
		awk -v name="$name" -F'[ :]+' '
			$1 == "pts" { t = $2 * 3600 + $3 * 60 + $4; n++; if (n == 1) first = t; last = t }
			$1 == "offset" { seq = $2 }
			END {
				fps = n > 1 && last > first ? (n - 1) / (last - first) : 0
				printf "consumer %s: %d of %d frames, %d dropped, %.1f fps\n", name, n, seq, seq - n, fps
			}'
done

if "$XMEM_INSPECT" --json | grep -q "\"name\":\"$pool\""; then
	echo "the pool's socket is still there"
	status=1
fi
if [ $status -eq 0 ]; then
	echo "done: the producer and both consumers exited 0; the pool is gone"
fi
exit $status
