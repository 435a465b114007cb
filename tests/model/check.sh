#!/usr/bin/env bash
# tests/model/check.sh - checks xmem.pml (and tickets.pml, growth.pml) with spin: every configuration below must
# verify with no error and a complete search; with --mutants, every seeded bug (and
# the code before each finding's fix, see README.md) must produce a counterexample.
#   check.sh [--mutants] [WORK_PARENT]   pan is built in a private directory under
#                                        WORK_PARENT (default: $TMPDIR or /tmp)
#   XMEM_MODEL_ONLY=REGEX                only the runs (or mutants) whose name matches
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
	# --model=FILE first among the defines: another model of this folder (tickets.pml).
	local source=$model
	if [[ "${1:-}" == --model=* ]]; then
		source=$here/${1#--model=}
		shift
	fi
	local cflags=() f
	for f in "${PAN_CFLAGS[@]}"; do
		if [ "$f" != -DBFS ] || [[ " $* " != *" -DDEPTH_FIRST "* ]]; then
			cflags+=("$f")
		fi
	done
	mkdir -p "$work/$name"
	(
		cd "$work/$name"
		cp "$source" xmem.pml
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
# The spill thread (system memory): the spill bounds, 1 buffer, both consumers fifo-spill
# (fallbacks: 0 drop-oldest, 1 drop-new), consumer 0 active, consumer 1 passive (killed
# at the end, maybe while a spill copies its frame); SAFIX: the proposed fixes of
# Findings 8, 9 and 10 (README.md).
SAHEAD="$SPILL -DSPILL_AHEAD -DNSP=1 -DPOLICY=3 -DFB0=0 -DFB1=1 -DPASSIVE1 -DPROBES=0 -DEXCL=0 -DEARLY=0"
SAFIX="-DACQUIRE_LOADS_IN_FLIGHT_FIRST -DFALLBACK_DROPS_FRAMES -DSPILL_RECHECKS_STATE"
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
	# The spill thread spilling ahead: its copy without publish_lock against acquire,
	# publish, claims and reaps; spill_refused's drops; spill-ahead-kill: consumer 0
	# killed at any step.
	"spill-ahead|$SAHEAD $SAFIX -DNF=2 -DKILL=0"
	"spill-ahead-kill|$SAHEAD $SAFIX -DNF=1 -DKILL=1"
	# Frame tickets (tickets.pml): one slot reused for 2 ticketed frames, 2 redeemers
	# of live, stale and forged tickets, one of them killed at any step; tickets for
	# one redemption, and for two.
	"tickets|--model=tickets.pml"
	"tickets-2|--model=tickets.pml -DREDEMPTIONS=2"
	# Growth on demand of device memory (growth.pml): one dynamic slot committed,
	# trimmed and committed again as new memory under 3 frames for 2 consumers that map
	# it by its generation, take frames by queue or get(), read on the GPU; consumer 0
	# killed at any step in growth-kill.
	"growth|--model=growth.pml"
	"growth-kill|--model=growth.pml -DKILL=1"
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
	# The spill thread, seeded bugs (acquire-ignores-spill: the code before 2c34312);
	# and Findings 8, 9 and 10, the code as it is (the other two fixes on); Finding 9
	# with the spill thread refusing as before Finding 11's fix (AHEAD_REFUSES), the only
	# caller of spill_refused after the last publish.
	"spill-skips-generation|-DMUTATION_SPILL_SKIPS_GENERATION $SAHEAD $SAFIX -DNF=1 -DKILL=0"
	"spill-no-owner-bit|-DMUTATION_SPILL_NO_OWNER_BIT $SAHEAD $SAFIX -DNF=1 -DKILL=0"
	"spill-no-notify|-DMUTATION_SPILL_NO_NOTIFY $SAHEAD $SAFIX -DNF=1 -DKILL=0"
	"acquire-ignores-spill|-DMUTATION_ACQUIRE_IGNORES_SPILL $SAHEAD $SAFIX -DNF=1 -DKILL=0"
	"drop-by-store|-DMUTATION_DROP_BY_STORE $SAHEAD $SAFIX -DNF=1 -DKILL=0"
	"acquire-misses-spill|$SAHEAD -DFALLBACK_DROPS_FRAMES -DSPILL_RECHECKS_STATE -DNF=1 -DKILL=0"
	"fallback-takes-eos|$SAHEAD -DAHEAD_REFUSES -DACQUIRE_LOADS_IN_FLIGHT_FIRST -DSPILL_RECHECKS_STATE -DNF=1 -DKILL=0"
	"spill-holds-reclaimed-slot|$SAHEAD -DACQUIRE_LOADS_IN_FLIGHT_FIRST -DFALLBACK_DROPS_FRAMES -DNF=2 -DKILL=0"
	# Frame tickets, seeded bugs (tickets.pml names each).
	"ticket-no-seq-check|--model=tickets.pml -DM_NO_SEQ_CHECK"
	"ticket-cas-first|--model=tickets.pml -DM_CAS_FIRST"
	"ticket-no-owner-hold|--model=tickets.pml -DM_NO_OWNER_HOLD"
	"ticket-no-zero|--model=tickets.pml -DM_NO_ZERO"
	"ticket-no-release|--model=tickets.pml -DM_NO_RELEASE"
	# Growth on demand of device memory, seeded bugs (growth.pml names each).
	"growth-no-remap|--model=growth.pml -DM_NO_REMAP"
	"growth-trim-by-state|--model=growth.pml -DM_TRIM_BY_STATE"
	"growth-no-claim-wait|--model=growth.pml -DM_NO_CLAIM_WAIT"
	"growth-reads-unguarded|--model=growth.pml -DM_UNMAP_NO_SYNC -DM_TRIM_IGNORES_READS"
)

status=0
if [ "$mode" = verify ]; then
	for entry in "${configs[@]}"; do
		name=${entry%%|*}
		[[ -z "${XMEM_MODEL_ONLY:-}" || "$name" =~ $XMEM_MODEL_ONLY ]] || continue
		read -r -a defs <<<"${entry#*|}"
		run "$name" "${defs[@]}"
		out=$work/$name/out
		if grep -q "errors: 0" "$out" && ! grep -qE "Search not completed|reached -DMEMLIM|too small|out of memory|max search depth" "$out"; then
			echo "$name: $(summary "$out") PASS"
		else
			echo "$name: $(summary "$out") FAIL (${defs[*]})"
			grep -E "^pan|assert|error|Warning|MEMLIM|too small" "$out" | head -20 || true
			if [ -f "$work/$name/xmem.pml.trail" ]; then
				spin_defs=()
				for f in "${defs[@]}"; do
					[[ "$f" == --model=* ]] || spin_defs+=("$f")
				done
				(cd "$work/$name" && spin "${spin_defs[@]}" -t -p xmem.pml | tail -60) || true
			fi
			status=1
		fi
	done
else
	for entry in "${mutants[@]}"; do
		name=${entry%%|*}
		[[ -z "${XMEM_MODEL_ONLY:-}" || "$name" =~ $XMEM_MODEL_ONLY ]] || continue
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
