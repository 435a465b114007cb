#!/usr/bin/env bash
# tests/bridge/stop.sh - the stop path of pipelines/bridge-common.sh (bridge-send.sh and
# bridge-receive.sh): a pipeline whose EOS never completes (xmemsink holds its first frame,
# and so the EOS, until a consumer that never comes attaches) must still end within its
# grace period of SIGINT, sent to the process group as Ctrl-C is, with its exact count.
# meson sets GST_PLUGIN_PATH.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
gst-inspect-1.0 xmemsink >/dev/null 2>&1 || { echo "SKIP: no xmemsink"; exit 77; }
work=$(mktemp -d)
pid=
cleanup() {
	[ -n "$pid" ] && kill -KILL -- "-$pid" 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT
mkdir -m 700 "$work/run"
# A background job of a script ignores SIGINT: env gives it back its default.
XDG_RUNTIME_DIR=$work/run XMEM_BRIDGE_STOP_GRACE=2 setsid env --default-signal=INT bash -c '
	cd "$1" && . pipelines/bridge-common.sh
	xmem_bridge_run stop-test passed 1 "" videotestsrc is-live=true \
		! identity name=bridge silent=false \
		! xmemsink pool-name=stop-test wait-for-consumers=1' _ "$root" >"$work/log" 2>&1 &
pid=$!
# Until the first frame has passed: the sink holds it.
deadline=$((SECONDS + 20))
until grep -q 'stop-test: passed' "$work/log" 2>/dev/null || [ $SECONDS -ge $deadline ]; do
	sleep 0.2
done
sleep 0.5
begun=$(date +%s%N)
kill -INT -- "-$pid"
status=0
while kill -0 "$pid" 2>/dev/null; do
	if [ $((($(date +%s%N) - begun) / 1000000)) -gt 6000 ]; then
		cat "$work/log" >&2
		echo "FAIL: still running 6 s after SIGINT (grace 2 s)" >&2
		exit 1
	fi
	sleep 0.1
done
wait "$pid" || status=$?
pid=
took_ms=$((($(date +%s%N) - begun) / 1000000))
grep -v 'caps =' "$work/log" | tail -n 4
[ "$status" -eq 0 ] || { echo "FAIL: exit status $status" >&2; exit 1; }
grep -q 'did not end within 2 s of its EOS' "$work/log" || { echo "FAIL: the EOS was not stuck: nothing tested" >&2; exit 1; }
passed=$(grep -o 'stop-test: passed [0-9]*$' "$work/log" | tail -n 1 | grep -o '[0-9]*$')
[ "$passed" = 1 ] || { echo "FAIL: counted $passed frames, the sink took 1" >&2; exit 1; }
[ "$took_ms" -ge 1800 ] || { echo "FAIL: ended after $took_ms ms, before its grace period" >&2; exit 1; }
echo "PASS: stopped $took_ms ms after SIGINT (grace 2 s), 1 frame counted"
