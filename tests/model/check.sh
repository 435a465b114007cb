#!/usr/bin/env bash
# tests/model/check.sh - checks xmem.pml (and tickets.pml, growth.pml) with spin: every configuration below must
# verify with no error and a complete search; with --mutants, every seeded bug (and
# the code before each finding's fix, see README.md) must produce a counterexample.
#   check.sh [--mutants] [WORK_PARENT]   pan is built in a private directory under
#                                        WORK_PARENT (default: $TMPDIR or /tmp)
#   XMEM_MODEL_ONLY=REGEX                only the runs (or mutants) whose name matches
#   XMEM_MODEL_CACHE=0                   reuse no cached result: every run runs (and
#                                        stores its result again)
#   XMEM_CACHE_DIR=dir                   the machine's cache (default /var/cache/xmem);
#                                        results live in its model/ (README.md, "The
#                                        result cache")
# Exits 77 (skipped) when spin or a C compiler is missing.
set -euo pipefail

mode=verify
if [ "${1:-}" = "--mutants" ]; then
	mode=mutants
	shift
fi
here=$(cd "$(dirname "$0")" && pwd)
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

# plan DEFINES... : what a run builds: sets source (the model file), defines (spin's)
# and cflags (pan's).
# --model=FILE first among the defines: another model of this folder (tickets.pml).
# -DDEPTH_FIRST among the defines (the model ignores it): a mutant searched depth-first,
# where the breadth-first search would pass the memory cap before its counterexample.
plan() {
	source=$here/xmem.pml
	if [[ "${1:-}" == --model=* ]]; then
		source=$here/${1#--model=}
		shift
	fi
	defines=("$@")
	cflags=()
	local f
	for f in "${PAN_CFLAGS[@]}"; do
		if [ "$f" != -DBFS ] || [[ " $* " != *" -DDEPTH_FIRST "* ]]; then
			cflags+=("$f")
		fi
	done
}

# run NAME: builds and runs pan as planned; leaves its output in $work/NAME/out.
run() {
	local name=$1
	mkdir -p "$work/$name"
	(
		cd "$work/$name"
		cp "$source" xmem.pml
		spin "${defines[@]}" -a xmem.pml >spin.out 2>&1 || {
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

# passed OUT TRAIL: whether pan's output OUT (TRAIL: yes when it left a trail) is what
# the mode asks for: verify, no error and a complete search; mutants, a counterexample.
passed() {
	local out=$1 trail=$2
	if [ "$mode" = verify ]; then
		grep -q "errors: 0" "$out" && ! grep -qE "Search not completed|reached -DMEMLIM|too small|out of memory|max search depth" "$out"
	else
		grep -qE "errors: [1-9]" "$out" && [ "$trail" = yes ]
	fi
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

# The result cache (README.md, "The result cache"). A run's verdict depends only on
# what key_text writes: the mode, the run's defines, pan's flags and arguments as
# applied to it, the model files, spin's and the compiler's versions, the functions
# above that build, run and judge it, and cache_format (raised when anything else the
# verdict depends on changes). A passing result is stored under the sha256 of that text
# and reused while nothing in it changes; a failure is never stored.
cache_format=1
# A file of this folder may be included by a model (spin runs the C preprocessor):
# all of them are inputs but the scripts, the docs and the build file.
inputs=$(cd "$here" && for f in *; do
	case $f in *.sh | *.md | meson.build) continue ;; esac
	[ -f "$f" ] && sha256sum -- "$f"
done)
tools=$(
	spin -V
	echo "$cc: $(command -v "$cc")"
	"$cc" --version
	uname -m
	declare -f plan run passed
)

# key_text: everything the planned run's verdict depends on.
key_text() {
	printf 'xmem model cache %s\nmode %s\nmodel %s\n' "$cache_format" "$mode" "${source#"$here"/}"
	printf 'define %s\n' "${defines[@]}"
	printf 'cflag %s\n' "${cflags[@]}"
	printf 'arg %s\n' "${PAN_ARGS[@]}"
	printf '%s\n' "$inputs" "$tools"
}

# The machine's cache (where tests/run-debian13.sh keeps its root), else the user's;
# none: every run runs.
cache=
for dir in "${XMEM_CACHE_DIR:-/var/cache/xmem}/model" ${HOME:+"${XDG_CACHE_HOME:-$HOME/.cache}/xmem/model"}; do
	if mkdir -p "$dir" 2>/dev/null && [ -w "$dir" ]; then
		cache=$dir
		break
	fi
done
reused=0
ran=0

# reuse NAME KEY: prints a stored result of KEY, as the run printed it, and succeeds;
# fails when there is none (or it no longer passes as passed judges it).
reuse() {
	local name=$1 key=$2 entry when result trail
	entry=$cache/$key
	[ -n "$cache" ] && [ "${XMEM_MODEL_CACHE:-1}" != 0 ] && [ -f "$entry" ] || return 1
	[ "$(head -1 "$entry")" = "xmem model result $cache_format" ] || return 1
	when=$(sed -n '2s/^date: //p' "$entry")
	result=$(sed -n '3s/^result: //p' "$entry")
	trail=$(sed -n '4s/^trail: //p' "$entry")
	sed '1,/^--- pan$/d' "$entry" >"$work/cached.out"
	[ -n "$result" ] && passed "$work/cached.out" "$trail" || return 1
	echo "$name: $result (cached $when, key ${key:0:12})"
}

# store KEY RESULT OUT TRAIL: keeps a passing run's summary and pan's output. Written
# to a temporary file and renamed, so that a run going on beside reads all or nothing.
store() {
	local key=$1 result=$2 out=$3 trail=$4 tmp
	[ -n "$cache" ] || return 0
	if tmp=$(mktemp "$cache/.$key.XXXXXX") && {
		echo "xmem model result $cache_format"
		echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
		echo "result: $result"
		echo "trail: $trail"
		echo "--- key"
		key_text
		echo "--- pan"
		cat "$out"
	} >"$tmp" && chmod 644 "$tmp" && mv -f "$tmp" "$cache/$key"; then
		return 0
	fi
	rm -f "${tmp:-}"
	echo "warning: could not store the result in $cache"
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
	# Meta indices (tickets.pml -DBY_INDEX): the same frames published by set_ref_count and
	# held by get(meta_index), stale and never-issued indices among them.
	"meta-index|--model=tickets.pml -DBY_INDEX"
	"meta-index-2|--model=tickets.pml -DBY_INDEX -DREDEMPTIONS=2"
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
	"meta-index-no-gen-check|--model=tickets.pml -DBY_INDEX -DM_NO_GEN_CHECK"
	"meta-index-counted-late|--model=tickets.pml -DBY_INDEX -DM_COUNTED_LATE"
	"meta-index-cas-first|--model=tickets.pml -DBY_INDEX -DM_CAS_FIRST"
	# Growth on demand of device memory, seeded bugs (growth.pml names each).
	"growth-no-remap|--model=growth.pml -DM_NO_REMAP"
	"growth-trim-by-state|--model=growth.pml -DM_TRIM_BY_STATE"
	"growth-no-claim-wait|--model=growth.pml -DM_NO_CLAIM_WAIT"
	"growth-reads-unguarded|--model=growth.pml -DM_UNMAP_NO_SYNC -DM_TRIM_IGNORES_READS"
)

status=0
if [ "$mode" = verify ]; then
	entries=("${configs[@]}")
else
	entries=("${mutants[@]}")
fi
for entry in "${entries[@]}"; do
	name=${entry%%|*}
	[[ -z "${XMEM_MODEL_ONLY:-}" || "$name" =~ $XMEM_MODEL_ONLY ]] || continue
	read -r -a defs <<<"${entry#*|}"
	plan "${defs[@]}"
	key=$(key_text | sha256sum | cut -d' ' -f1)
	if reuse "$name" "$key"; then
		reused=$((reused + 1))
		continue
	fi
	run "$name"
	ran=$((ran + 1))
	out=$work/$name/out
	trail=no
	[ -f "$work/$name/xmem.pml.trail" ] && trail=yes
	if [ "$mode" = verify ]; then
		if passed "$out" "$trail"; then
			result="$(summary "$out") PASS"
			echo "$name: $result"
			store "$key" "$result" "$out" "$trail"
		else
			echo "$name: $(summary "$out") FAIL (${defs[*]})"
			grep -E "^pan|assert|error|Warning|MEMLIM|too small" "$out" | head -20 || true
			if [ "$trail" = yes ]; then
				(cd "$work/$name" && spin "${defines[@]}" -t -p xmem.pml | tail -60) || true
			fi
			status=1
		fi
	else
		if passed "$out" "$trail"; then
			what=$(grep -E "^pan:1: " "$out" | head -1 | cut -c1-160)
			result="$(summary "$out") CAUGHT: ${what}"
			echo "$name: $result"
			store "$key" "$result" "$out" "$trail"
		else
			echo "$name: $(summary "$out") MISSED: no counterexample (${defs[*]})"
			status=1
		fi
	fi
done
if [ -z "$cache" ]; then
	echo "model cache: none writable (XMEM_CACHE_DIR, XDG_CACHE_HOME): $ran ran"
elif [ "${XMEM_MODEL_CACHE:-1}" = 0 ]; then
	echo "model cache $cache: not read (XMEM_MODEL_CACHE=0), $ran ran"
else
	echo "model cache $cache: $reused reused, $ran ran"
fi
exit $status
