#!/usr/bin/env bash
# tests/model/check.sh - checks xmem.pml with spin: every configuration below must
# verify with no error and a complete search; with --mutants, every seeded bug (and
# the code before each finding's fix, see README.md) must produce a counterexample.
#   check.sh [--mutants] [WORK_PARENT]   pan is built in a private directory under
#                                        WORK_PARENT (default: $TMPDIR or /tmp)
# Exits 77 (skipped) when spin or a C compiler is missing.
set -euo pipefail

mode=verify
if [ "${1:-}" = "--mutants" ]; then
	mode=mutants
	shift
fi
here=$(cd "$(dirname "$0")" && pwd)
model=$here/xmem.pml
cc=${CC:-gcc}
if ! command -v spin >/dev/null 2>&1; then
	echo "spin is not installed: skipped"
	exit 77
fi
if ! command -v "$cc" >/dev/null 2>&1; then
	echo "no C compiler ($cc): skipped"
	exit 77
fi
parent=${1:-${TMPDIR:-/tmp}}
mkdir -p "$parent"
work=$(mktemp -d "$parent/model-$mode.XXXXXX")
trap 'rm -rf "$work"' EXIT

# Exhaustive safety search: assertions, the Monitor's invariants, invalid end states.
# COLLAPSE compresses state vectors; MEMLIM caps memory at 2 GB (hitting it is a
# failure: the search was incomplete).
# COLLAPSE is lossless (the search stays exhaustive); no hash compaction or bitstate.
# Mutant runs search breadth-first (-DBFS, also exhaustive) so that a counterexample
# is found early and its trail is the shortest.
PAN_CFLAGS=(-O2 -w -DSAFETY -DCOLLAPSE -DMEMLIM=2048)
PAN_ARGS=(-m400000)
if [ "$mode" = mutants ]; then
	PAN_CFLAGS+=(-DBFS)
fi

# run NAME DEFINES... : builds and runs pan; leaves its output in $work/NAME/out.
# -DDEPTH_FIRST among the defines (the model ignores it): a mutant searched depth-first,
# where the breadth-first search would pass the memory cap before its counterexample.
run() {
	local name=$1
	shift
	local cflags=() f
	for f in "${PAN_CFLAGS[@]}"; do
		if [ "$f" != -DBFS ] || [[ " $* " != *" -DDEPTH_FIRST "* ]]; then
			cflags+=("$f")
		fi
	done
	mkdir -p "$work/$name"
	(
		cd "$work/$name"
		cp "$model" xmem.pml
		spin "$@" -a xmem.pml >spin.out 2>&1 || {
			cat spin.out
			exit 1
		}
		"$cc" "${cflags[@]}" -o pan pan.c
		local t0 t1
		t0=$(date +%s.%N)
		./pan "${PAN_ARGS[@]}" >out 2>&1 || true
		t1=$(date +%s.%N)
		echo "wall $(echo "$t1 - $t0" | bc) s" >>out
	)
}

summary() {
	local out=$1
	local states depth mem elapsed
	states=$(awk '/states, stored/ { print $1; exit }' "$out")
	depth=$(sed -n 's/.*depth reached \([0-9]*\).*/\1/p' "$out" | head -1)
	mem=$(awk '/total actual memory usage/ { print $1; exit }' "$out")
	elapsed=$(awk '/^wall/ { print $2; exit }' "$out")
	printf 'states=%s depth=%s memory=%sMB time=%ss' "${states:-?}" "${depth:-?}" "${mem:-?}" "${elapsed:-?}"
}

# The verified configurations (README.md, "Runs"). NAME DEFINES...
SPILL="-DNS=2 -DNO_WAKEUP -DACQUIRE_RETRIES_ON_PROGRESS"
# The spill tier of a device pool: the spill bounds with GPU ordering, 1 buffer, both
# consumers fifo-spill (fallbacks: 0 drop-oldest, 1 drop-new), consumer 0 active,
# consumer 1 passive (killed and reaped at the end, its spilled frame still queued).
GSPILL="-DGPU -DSYNC_AT_CLOSE $SPILL -DNSP=1 -DPOLICY=3 -DFB0=0 -DFB1=1 -DPASSIVE1 -DKILL=0 -DPROBES=0 -DEXCL=0 -DEARLY=0"
configs=(
	"drop-oldest|-DKILL=0 -DPROBES=0 -DEXCL=0 -DEARLY=0"
	"exclusive|-DNF=0 -DKILL=0 -DPROBES=2 -DEXCL=1 -DEARLY=0"
	"kill|-DPASSIVE1 -DKILL=1 -DPROBES=0 -DEXCL=0 -DEARLY=0"
	"drop-new|-DPOLICY=1 -DPASSIVE1 -DKILL=1 -DPROBES=0 -DEXCL=0 -DEARLY=0"
	"block|-DPOLICY=2 -DPASSIVE1 -DKILL=1 -DPROBES=0 -DEXCL=0 -DEARLY=0"
	"owner-closes|-DOWNER_CLOSES -DPASSIVE1 -DKILL=0 -DPROBES=0 -DEXCL=0 -DEARLY=1"
	"gpu|-DGPU -DSYNC_AT_CLOSE -DPOLICY=1 -DPASSIVE1 -DKILL=0 -DPROBES=0 -DEXCL=0 -DEARLY=0"
	# The spill tier: 2 slots, NSP buffers, ring_capacity 2 + NSP + 1, each consumer's
	# own policy P0/P1 (POLICY: both) and fallback FB0/FB1 (3 fifo-spill, 0
	# drop-oldest, 1 drop-new); with Finding 3's proposed fix
	# (ACQUIRE_RETRIES_ON_PROGRESS), without the wake-up handshake (NO_WAKEUP).
	"spill|$SPILL -DNSP=1 -DPOLICY=3 -DFB0=1 -DFB1=0 -DNF=1 -DKILL=0 -DPROBES=0 -DEXCL=3 -DEARLY=0"
	"spill-kill|$SPILL -DNSP=1 -DPOLICY=3 -DFB0=0 -DFB1=1 -DNF=2 -DPASSIVE1 -DKILL=1 -DPROBES=0 -DEXCL=0 -DEARLY=1"
	"spill-mixed|$SPILL -DNSP=1 -DP0=0 -DP1=3 -DFB1=0 -DNF=2 -DPASSIVE1 -DKILL=1 -DPROBES=0 -DEXCL=0 -DEARLY=0"
	"spill-excl|$SPILL -DNSP=1 -DPOLICY=3 -DFB0=0 -DFB1=1 -DNF=2 -DPASSIVE1 -DKILL=0 -DPROBES=1 -DEXCL=1 -DEARLY=0"
	"spill-excl-kill|$SPILL -DSPILL_TAKES_EXCLUSIVE -DNSP=1 -DPOLICY=3 -DFB0=0 -DFB1=1 -DNF=2 -DPASSIVE1 -DKILL=1 -DPROBES=1 -DEXCL=1 -DEARLY=0"
	"spill-2buf|$SPILL -DNSP=2 -DQSP=2 -DPOLICY=3 -DFB0=0 -DFB1=1 -DNF=2 -DPASSIVE1 -DKILL=1 -DPROBES=0 -DEXCL=0 -DEARLY=0"
	# wake=spin-before: consumer 0 may spin (disarming itself) at up to two empty
	# looks, against the push's exchange of armed, kills and fifo's deadline.
	"spin-before-kill|-DSPIN_WAKE=2 -DPASSIVE1 -DKILL=1 -DPROBES=0 -DEXCL=0 -DEARLY=0"
	"spin-before-drop-new|-DSPIN_WAKE=2 -DPOLICY=1 -DPASSIVE1 -DKILL=1 -DPROBES=0 -DEXCL=0 -DEARLY=0"
	"spin-before-block|-DSPIN_WAKE=2 -DPOLICY=2 -DPASSIVE1 -DKILL=1 -DPROBES=0 -DEXCL=0 -DEARLY=0"
	# The spill tier of a device pool: the copy on the owner's spill stream after the
	# slot's ready word, spill_ready, the owner's done word; frame 2's GPU writes still
	# queued at the start (GPU_SETTLED: done). gpu-spill-close: the owner closes, with
	# Finding 7's proposed fix (CLOSE_DRAINS_STREAMS, GONE_RECHECKS_SPILL).
	"gpu-spill|$GSPILL -DNF=1"
	"gpu-spill-2|$GSPILL -DNF=2 -DGPU_SETTLED"
	"gpu-spill-close|$GSPILL -DNF=1 -DGPU_SETTLED -DOWNER_CLOSES -DCLOSE_DRAINS_STREAMS -DGONE_RECHECKS_SPILL"
)

# Seeded bugs (and the code before a finding's fix): each must yield a counterexample.
# NAME|DEFINES
mutants=(
	"reap-skips-word|-DMUTATION_REAP_SKIPS_WORD -DPASSIVE1 -DKILL=1 -DPROBES=0 -DEXCL=0 -DEARLY=0"
	"no-pending-check|-DMUTATION_NO_PENDING_CHECK -DSYNC_AT_CLOSE -DGPU -DPOLICY=1 -DPASSIVE1 -DKILL=0 -DPROBES=0 -DEXCL=0 -DEARLY=0"
	"head-store|-DMUTATION_HEAD_STORE -DNF=2 -DPASSIVE1 -DKILL=0 -DPROBES=0 -DEXCL=0 -DEARLY=0"
	"unpatched-exclusive|-DUNPATCHED_EXCLUSIVE -DNF=0 -DKILL=0 -DPROBES=2 -DEXCL=1 -DEARLY=0"
	"no-drain-at-close|-DGPU -DPOLICY=1 -DPASSIVE1 -DKILL=0 -DPROBES=0 -DEXCL=0 -DEARLY=0"
	"head-first|-DMUTATION_HEAD_FIRST $SPILL -DNSP=1 -DPOLICY=3 -DFB0=1 -DFB1=0 -DNF=1 -DKILL=0 -DPROBES=0 -DEXCL=0 -DEARLY=0"
	"no-claim|-DMUTATION_NO_CLAIM $SPILL -DNSP=1 -DPOLICY=3 -DFB0=1 -DFB1=0 -DNF=1 -DKILL=0 -DPROBES=0 -DEXCL=0 -DEARLY=0"
	"spill-keeps-bit|-DMUTATION_SPILL_KEEPS_BIT $SPILL -DNSP=1 -DPOLICY=3 -DFB0=1 -DFB1=0 -DNF=1 -DKILL=0 -DPROBES=0 -DEXCL=0 -DEARLY=0"
	"reap-skips-spill|-DMUTATION_REAP_SKIPS_SPILL $SPILL -DNSP=1 -DPOLICY=3 -DFB0=0 -DFB1=1 -DNF=2 -DPASSIVE1 -DKILL=1 -DPROBES=0 -DEXCL=0 -DEARLY=0"
	# Findings 3 and 4 (README.md): the code as it is, without the proposed fixes.
	"acquire-waits-for-free-slot|-DNS=2 -DNO_WAKEUP -DNSP=1 -DPOLICY=3 -DFB0=0 -DFB1=1 -DNF=2 -DPASSIVE1 -DKILL=1 -DPROBES=0 -DEXCL=0 -DEARLY=0"
	"spill-skips-exclusive|$SPILL -DNSP=1 -DPOLICY=3 -DFB0=0 -DFB1=1 -DNF=2 -DPASSIVE1 -DKILL=1 -DPROBES=1 -DEXCL=1 -DEARLY=0"
	# Finding 6: receive armed with a store (the code before its fix).
	"arm-by-store|-DMUTATION_ARM_BY_STORE -DPASSIVE1 -DKILL=1 -DPROBES=0 -DEXCL=0 -DEARLY=0"
	# wake=spin-before's disarm, seeded bugs.
	"spin-forgets-write|-DMUTATION_SPIN_FORGETS_WRITE -DSPIN_WAKE=2 -DPASSIVE1 -DKILL=1 -DPROBES=0 -DEXCL=0 -DEARLY=0"
	"spin-skips-arm|-DMUTATION_SPIN_SKIPS_ARM -DSPIN_WAKE=2 -DPASSIVE1 -DKILL=1 -DPROBES=0 -DEXCL=0 -DEARLY=0"
	# The spill tier of a device pool, seeded bugs (collect-ignores-copy: the code
	# before 4fc2d35's extra condition; depth-first: breadth-first passes the memory
	# cap first); and Finding 7, the code as it is: the owner closes with GPU work
	# queued.
	"collect-ignores-copy|-DMUTATION_COLLECT_IGNORES_COPY -DDEPTH_FIRST $GSPILL -DNF=1"
	"spill-skips-ready|-DMUTATION_SPILL_SKIPS_READY $GSPILL -DNF=1"
	"spill-skips-done|-DMUTATION_SPILL_SKIPS_DONE $GSPILL -DNF=1"
	"no-spill-wait|-DMUTATION_NO_SPILL_WAIT $GSPILL -DNF=1"
	"close-loses-frames|$GSPILL -DNF=1 -DGPU_SETTLED -DOWNER_CLOSES"
)

status=0
if [ "$mode" = verify ]; then
	for entry in "${configs[@]}"; do
		name=${entry%%|*}
		read -r -a defs <<<"${entry#*|}"
		run "$name" "${defs[@]}"
		out=$work/$name/out
		if grep -q "errors: 0" "$out" && ! grep -qE "Search not completed|reached -DMEMLIM|too small|out of memory|max search depth" "$out"; then
			echo "$name: $(summary "$out") PASS"
		else
			echo "$name: $(summary "$out") FAIL (${defs[*]})"
			grep -E "^pan|assert|error|Warning|MEMLIM|too small" "$out" | head -20 || true
			if [ -f "$work/$name/xmem.pml.trail" ]; then
				(cd "$work/$name" && spin "${defs[@]}" -t -p xmem.pml | tail -60) || true
			fi
			status=1
		fi
	done
else
	for entry in "${mutants[@]}"; do
		name=${entry%%|*}
		read -r -a defs <<<"${entry#*|}"
		run "$name" "${defs[@]}"
		out=$work/$name/out
		if grep -qE "errors: [1-9]" "$out" && [ -f "$work/$name/xmem.pml.trail" ]; then
			what=$(grep -E "^pan:1: " "$out" | head -1 | cut -c1-160)
			echo "$name: $(summary "$out") CAUGHT: ${what}"
		else
			echo "$name: $(summary "$out") MISSED: no counterexample (${defs[*]})"
			status=1
		fi
	done
fi
exit $status
