# pipelines/bridge-common.sh - sourced by bridge-send.sh and bridge-receive.sh: runs their
# gst-launch-1.0 line again whenever it ends, counts the frames it passes, and stops cleanly.

# shellcheck shell=bash

# xmem_bridge_run PREFIX WHAT AGAIN ONCE PIPELINE...: runs gst-launch-1.0 -e -v PIPELINE
# (whose identity name=bridge silent=false passes each frame once) until SIGINT, SIGTERM or
# SIGHUP, again AGAIN seconds after each time it ends (ONCE non-empty: not after a clean
# end). Prints "PREFIX: WHAT N" (frames passed, all runs together) every 10 s and, exactly,
# when it ends.
# gst-launch runs in a session of its own, so that Ctrl-C in a terminal (sent to the whole
# foreground process group) reaches it once, from here: a second SIGINT would kill it
# before its EOS has drained and its last frames are counted. On a stop signal it gets
# SIGINT (EOS, -e), then SIGTERM after XMEM_BRIDGE_STOP_GRACE seconds (default 3): an EOS
# can wait for a frame that never comes (bridge-send with no producer in its pool).
xmem_bridge_run() {
	local prefix=$1 what=$2 again=$3 once=$4
	shift 4
	# mawk (Debian's awk) reads a pipe by blocks unless told to read it line by line.
	local awk_options=()
	if awk -W version 2>&1 | grep -q mawk; then
		awk_options=(-W interactive)
	fi
	local dir total=0 stopping='' gst_pid='' killer_pid='' counter_pid rc=0 frames
	dir=$(mktemp -d)
	mkfifo "$dir/output"
	# shellcheck disable=SC2317 # called by the trap
	on_stop() {
		stopping=1
		if [ -n "$gst_pid" ] && [ -z "$killer_pid" ]; then
			kill -INT "$gst_pid" 2>/dev/null || true
			(
				sleep "${XMEM_BRIDGE_STOP_GRACE:-3}"
				kill -TERM "$gst_pid" 2>/dev/null
			) &
			killer_pid=$!
		fi
	}
	trap on_stop INT TERM HUP
	while [ -z "$stopping" ]; do
		# stdbuf: gst-launch's output is a pipe, which stdio would buffer by 4 KiB, so the
		# counter would lag and lose the tail should gst-launch be killed.
		# -X: rtpvrawpay and the SRT elements report seqnum/timestamp per packet (thousands
		# of lines a second at 720p): only the identity's one line a frame is wanted.
		setsid stdbuf -oL -eL gst-launch-1.0 -e -v -X seqnum -X timestamp -X stats "$@" >"$dir/output" 2>&1 &
		gst_pid=$!
		# The counter ignores stop signals: it ends when gst-launch's output does.
		(
			trap '' INT TERM HUP
			exec awk "${awk_options[@]}" -v prefix="$prefix" -v what="$what" -v base="$total" -v every=10 \
				-v count_file="$dir/count" '
				/bridge.*last-message = chain/ {
					frames++
					if (systime() - last >= every) { last = systime(); print prefix ": " what " " base + frames; fflush() }
					next
				}
				/last-message/ { next }
				{ print; fflush() }
				END { print frames + 0 > count_file }'
		) <"$dir/output" &
		counter_pid=$!
		# A signal that came before gst_pid was set.
		if [ -n "$stopping" ]; then
			stopping=''
			on_stop
		fi
		# wait returns early when a trap runs: wait again until gst-launch has ended.
		while :; do
			rc=0
			wait "$gst_pid" || rc=$?
			kill -0 "$gst_pid" 2>/dev/null || break
		done
		wait "$counter_pid" || true
		frames=$(cat "$dir/count" 2>/dev/null || echo 0)
		total=$((total + frames))
		gst_pid=''
		if [ -n "$killer_pid" ]; then
			kill "$killer_pid" 2>/dev/null || true
			wait "$killer_pid" 2>/dev/null || true
			killer_pid=''
		fi
		if [ -n "$stopping" ] || { [ -n "$once" ] && [ "$rc" -eq 0 ]; }; then
			break
		fi
		echo "$prefix.sh: the pipeline ended (status $rc): starting it again" >&2
		sleep "$again"
	done
	rm -rf "$dir"
	echo "$prefix: $what $total"
	if [ -n "$stopping" ]; then
		if [ "$rc" -ne 0 ]; then
			echo "$prefix.sh: the pipeline did not end within ${XMEM_BRIDGE_STOP_GRACE:-3} s of its EOS (status $rc): stopped" >&2
		fi
		return 0
	fi
	return "$rc"
}
