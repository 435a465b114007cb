#!/usr/bin/env bash
# run.sh - runs xmem's benchmarks, prints a table, writes bench/results/<platform>/<suite>.json
# and, with --update-docs, regenerates docs/benchmarks.md from those files, all platforms.
#
# usage: bench/run.sh [--update-docs] [--docs-only] [--quick] [--build-dir DIR]
#                     [--platform NAME] [SUITE...]
#
#   SUITE          core: libxmem alone; gst: xmemsink/xmemsrc against shmsink/shmsrc,
#                  unixfdsink/unixfdsrc and appsrc ! appsink; python: frames as torch
#                  tensors in Python, against appsink and torch.multiprocessing;
#                  policies: libxmem's per-consumer policies at 1080p60, a latest
#                  consumer beside a stalled fifo-spill one (and without it), and
#                  wake=spin-before against sleeping; classes: libxmem's handoff
#                  with 8 size classes in the pool against 1, the frames' class
#                  the last of them
#                  (default: all of them)
#   --update-docs  rewrite docs/benchmarks.md from bench/results/*/*.json: a section
#                  per platform (each platform's results stay where its runs wrote them)
#   --docs-only    measure nothing: only rewrite docs/benchmarks.md (implies --update-docs)
#   --quick        a few frames per measurement: checks that everything runs,
#                  the numbers are not worth publishing (the JSON says quick)
#   --build-dir    the Meson build directory (default: build, as tests/run.sh)
#   --platform     where the results go, bench/results/NAME/ (default: ID and
#                  VERSION_ID of /etc/os-release, e.g. debian12, debian13)
#   XMEM_SKIP_SETUP=1  use the build directory as it is: no package install, no
#                  configure or compile (a root where nothing may be installed)
#
# Each suite is one function that runs its measured pairs; each measurement
# prints exactly one JSON object on one line. A new pair is a new function, a new
# suite a new function and a name in all_suites, nothing else changes.
# The pairs and suites are called by name (suite_$suite), which shellcheck cannot see.
# shellcheck disable=SC2317
set -euo pipefail

cd "$(dirname "$0")/.."
root=$PWD
invocation="bench/run.sh${*:+ $*}"

build_dir=build
update_docs=0
docs_only=0
quick=0
platform=
suites=()
while [ $# -gt 0 ]; do
	case "$1" in
	--update-docs) update_docs=1 ;;
	--docs-only) update_docs=1 docs_only=1 ;;
	--quick) quick=1 ;;
	--platform)
		[ $# -ge 2 ] || { echo "run.sh: --platform needs a name" >&2; exit 2; }
		platform=$2
		shift
		;;
	--build-dir)
		[ $# -ge 2 ] || { echo "run.sh: --build-dir needs a directory" >&2; exit 2; }
		build_dir=$2
		shift
		;;
	-h | --help)
		sed -n '4,31p' "$0" | sed 's/^# \{0,1\}//'
		exit 0
		;;
	-*)
		echo "run.sh: unknown option $1" >&2
		exit 2
		;;
	*) suites+=("$1") ;;
	esac
	shift
done
all_suites=(core gst python policies classes)
if [ "$docs_only" = 1 ]; then
	suites=()
elif [ ${#suites[@]} -eq 0 ]; then
	suites=("${all_suites[@]}")
fi
for suite in ${suites[@]+"${suites[@]}"}; do
	if [[ " ${all_suites[*]} " != *" $suite "* ]]; then
		echo "run.sh: unknown suite '$suite'" >&2
		exit 2
	fi
done

# shellcheck source=tools/bootstrap.sh
. tools/bootstrap.sh

# The platform: one folder of results each, so that a run on one never overwrites
# another's (docs/benchmarks.md shows them side by side).
if [ -z "$platform" ]; then
	# shellcheck source=/dev/null
	platform=$(. /etc/os-release 2>/dev/null && v=${VERSION_ID:-} && printf '%s%s' "${ID:-unknown}" "${v%%.*}") || platform=unknown
fi
if [[ ! "$platform" =~ ^[A-Za-z0-9._-]+$ ]] || [[ "$platform" == soak-* ]]; then
	echo "run.sh: bad platform name '$platform'" >&2
	exit 2
fi
results_dir=$root/bench/results/$platform
[ "$docs_only" = 1 ] || mkdir -p "$results_dir"

# Sizes every frame-size-dependent measurement runs at.
sizes="640x480 1920x1080 3840x2160"

if [ "$quick" = 1 ]; then
	latency_frames=60 fanout_frames=30 throughput_frames=2000 warmup=20 throughput_seconds=0.5 throughput_runs=1
else
	latency_frames=600 fanout_frames=300 throughput_frames=100000 warmup=60 throughput_seconds=1.5
	throughput_runs=3
fi

# build TARGET...: configures the build directory once, then builds TARGETs; with
# XMEM_SKIP_SETUP, only checks that the build directory has been configured.
build() {
	if [ -n "${XMEM_SKIP_SETUP:-}" ]; then
		[ -f "$build_dir/build.ninja" ]
		return
	fi
	if [ ! -f "$build_dir/build.ninja" ]; then
		xmem_configure "$build_dir" >&2
	fi
	# Regenerates first when a meson.build changed, so that new targets are known.
	ninja -C "$build_dir" build.ninja >/dev/null
	# A no-op when up to date; rebuilds a stale binary rather than measure it.
	meson compile -C "$build_dir" "$@" >&2
}

# One measurement of the core benchmark: its JSON line on stdout, its diagnostics
# on stderr. A failed run (dropped or corrupt frames, a consumer error) is kept in
# the results with "ok": false, and makes run.sh exit non-zero at the end.
failed=0
core() {
	local line
	if ! line=$("$build_dir/bench/xmem-bench-core" --json "$@"); then
		failed=1
	fi
	if [ -z "$line" ]; then
		echo "run.sh: xmem-bench-core $* printed no result" >&2
		failed=1
		return
	fi
	echo "$line"
	echo "run.sh: $(printf '%s' "$line" | python3 -c 'import json,sys; r=json.load(sys.stdin); print("{pair} {mode} {size} x{consumers}: p50 {p50_us} us, p99 {p99_us} us, {fps} fps".format(**r))')" >&2
}

# Pair xmem-core: libxmem alone, one producer and N consumer processes.
pair_xmem_core() {
	local size w h
	for size in $sizes; do
		w=${size%x*} h=${size#*x}
		core --mode latency --width "$w" --height "$h" --fps 60 --frames "$latency_frames" --warmup "$warmup"
		core --mode throughput --width "$w" --height "$h" --fps 0 --frames "$throughput_frames" \
			--warmup "$warmup" --slots 8 --queue 4 --policy block
		core --mode fanout --width "$w" --height "$h" --fps 60 --frames "$fanout_frames" --warmup "$warmup" \
			--consumers 4
	done
}

# Pair eventfd-memfd: the floor under xmem-core, the same wake-up path without a
# pool (a stamp in a shared page, one eventfd write per consumer). Frame size does
# not enter it, so it runs at one size.
pair_eventfd_memfd() {
	core --pair eventfd-memfd --mode latency --fps 60 --frames "$latency_frames" --warmup "$warmup"
	core --pair eventfd-memfd --mode fanout --fps 60 --frames "$fanout_frames" --warmup "$warmup" --consumers 4
}

suite_core() {
	build xmem-bench-core
	pair_xmem_core
	pair_eventfd_memfd
}

# One measurement of the GStreamer benchmark: gst PAIR MODE SIZE FPS FRAMES CONSUMERS [OPTION...].
# Like core(), plus a time limit: a run that hangs is killed and recorded as failed.
# Unthrottled, the median of $throughput_runs runs by frames/s (each run's figure in
# fps_runs): how often a thread falls asleep and must be woken decides the rate,
# and that changes from one run to the next. The record is also left in gst_record.
gst_record=
gst() {
	local pair=$1 mode=$2 size=$3 fps=$4 frames=$5 consumers=$6 limit line rc runs=1 lines=()
	shift 6
	local args=(--pair "$pair" --mode "$mode" --width "${size%x*}" --height "${size#*x}" --fps "$fps"
		--frames "$frames" --warmup "$warmup" --consumers "$consumers" "$@")
	if [ "$fps" = 0 ]; then
		args+=(--seconds "$throughput_seconds")
		limit=60 runs=$throughput_runs
	else
		limit=$(((warmup + frames) * 2 / fps + 45))
	fi
	while [ ${#lines[@]} -lt "$runs" ]; do
		rc=0
		line=$(timeout -k 5 $((limit + 10)) "$build_dir/bench/xmem-bench-gst" --json --timeout "$limit" \
			"${args[@]}") || rc=$?
		if [ -z "$line" ]; then
			# Killed, or crashed: a record all the same, so that the table says so.
			line=$(python3 -c 'import json,sys; print(json.dumps({"pair": sys.argv[1], "mode": sys.argv[2],
				"size": sys.argv[3], "consumers": int(sys.argv[4]), "available": True, "ok": False,
				"error": "xmem-bench-gst printed no result (exit status %s)" % sys.argv[5],
				"command": "xmem-bench-gst " + " ".join(sys.argv[6:])}))' \
				"$pair" "$mode" "$size" "$consumers" "$rc" --json --timeout "$limit" "${args[@]}")
		fi
		lines+=("$line")
		# An unavailable pair says so at once.
		printf '%s' "$line" | grep -q '"available": false' && break
	done
	line=$(printf '%s\n' "${lines[@]}" | python3 -c 'import json,sys
runs = [json.loads(l) for l in sys.stdin if l.strip()]
good = sorted((r for r in runs if r.get("ok") and "fps" in r), key=lambda r: r["fps"])
pick = good[len(good) // 2] if good else runs[0]
if len(runs) > 1:
    pick["fps_runs"] = [r.get("fps") for r in runs]
    pick["failed_runs"] = sum(1 for r in runs if not r.get("ok"))
print(json.dumps(pick, ensure_ascii=False))')
	printf '%s\n' "$line"
	gst_record=$line
	if ! printf '%s' "$line" | python3 -c 'import json,sys; r=json.load(sys.stdin); sys.exit(0 if r["ok"] else 1)'; then
		failed=1
	fi
	echo "run.sh: $(printf '%s' "$line" | python3 -c 'import json,sys; r=json.load(sys.stdin)
print("{pair} {mode} {size} x{consumers}: ".format(**r) + (("p50 {p50_us} us, p99 {p99_us} us, {fps} fps, "
      "{cpu_us_per_frame} us CPU/frame".format(**r)) if "p50_us" in r else r.get("error", "?")))')" >&2
}

# gst_modes PAIR SIZE: the three measurements of a pair at one frame size.
gst_modes() {
	gst "$1" latency "$2" 60 "$latency_frames" 1
	gst "$1" throughput "$2" 0 "$throughput_frames" 1
	gst "$1" fanout "$2" 60 "$fanout_frames" 4
}

# Pair xmem: xmemsink ! xmemsrc, the zero-copy pool.
pair_xmem() { gst_modes xmem "$1"; }
# Pair xmem-spin: the same, xmemsrc wake=spin-before (a 500 us spin budget): latency
# at 60 fps, where spinning is meant to help, and what it costs in CPU per frame.
pair_xmem_spin() { gst xmem-spin latency "$1" 60 "$latency_frames" 1; }
# Pair shm: shmsink ! shmsrc at their best settings (see xmem-bench-gst.cpp).
pair_shm() { gst_modes shm "$1"; }
# Pair floor: appsrc ! appsink in one process, what any handoff costs at least.
pair_floor() { gst_modes floor "$1"; }
# Pair unixfd: unixfdsink ! unixfdsrc, GStreamer 1.24 and later; said to be
# unavailable (once) where they are missing.
unixfd_available=
pair_unixfd() {
	if [ -z "$unixfd_available" ]; then
		gst unixfd latency "$1" 60 "$latency_frames" 1
		if printf '%s' "$gst_record" | grep -q '"available": false'; then
			unixfd_available=no
			return
		fi
		unixfd_available=yes
		gst unixfd throughput "$1" 0 "$throughput_frames" 1
		gst unixfd fanout "$1" 60 "$fanout_frames" 4
	elif [ "$unixfd_available" = yes ]; then
		gst_modes unixfd "$1"
	fi
}

suite_gst() {
	# shmsink/shmsrc (and unixfd*) live in gst-plugins-bad.
	if [ -z "${XMEM_SKIP_SETUP:-}" ]; then
		xmem_install_packages gstreamer1.0-plugins-bad >&2 ||
			echo "run.sh: cannot install gstreamer1.0-plugins-bad; the shm pair will fail" >&2
	fi
	# Built only where GStreamer's development files are (bench/meson.build, gst/meson.build).
	if ! build xmem-bench-gst gstxmem || [ ! -x "$build_dir/bench/xmem-bench-gst" ]; then
		echo "run.sh: cannot build xmem-bench-gst and the xmem plugin (gstreamer-app-1.0 missing?)" >&2
		failed=1
		return
	fi
	xmem_gst_env "$(realpath --relative-to="$PWD" "$build_dir")"
	# The first gst_init after a plugin changed rescans the registry; once, here.
	timeout 60 gst-inspect-1.0 xmemsink >/dev/null 2>&1 || true
	# Pairs interleaved at each size, so that a change in the machine's load hits
	# them alike.
	local size pair
	for size in $sizes; do
		pair_xmem "$size"
		pair_xmem_spin "$size"
		pair_shm "$size"
		pair_floor "$size"
		pair_unixfd "$size"
	done
	# Where the time goes: the 1080p latency run again, timed at the sink's and
	# the source's pads too (probes that read the stamp; a separate run, so that
	# the measurements above have none).
	for pair in xmem shm floor; do
		gst "$pair" breakdown 1920x1080 60 "$fanout_frames" 1 --breakdown
	done
	if [ "$unixfd_available" = yes ]; then
		gst unixfd breakdown 1920x1080 60 "$fanout_frames" 1 --breakdown
	fi
}

# The Python suite: bench/python.py's records, one per pair and device (GPU pairs
# say unavailable without one).
suite_python() {
	local frames=600 out rc=0
	[ "$quick" = 1 ] && frames=60
	out=$(XMEM_BUILD_DIR=$build_dir bench/python.sh --json --frames "$frames") || rc=$?
	printf '%s\n' "$out" | grep '^{' || true
	if [ "$rc" != 0 ]; then
		echo "run.sh: bench/python.py exited with status $rc" >&2
		failed=1
	fi
}

# Pair stalled-spill: the producer with a latest consumer, alone (mode stall-off)
# and beside a fifo-spill consumer that stops reading for stall_ms every
# stall_every_ms (stall-on): its frames go to a 1 GiB spill tier, which the
# producer and the latest consumer should not notice.
pair_stalled_spill() {
	local common=(--width 1920 --height 1080 --fps 60 --frames "$stall_frames" --warmup "$warmup"
		--consumer-policy latest --spill-mb 1024)
	core --mode stall-off "${common[@]}" --stall-ms 0
	core --mode stall-on "${common[@]}" --stall-ms "$stall_ms" --stall-every-ms "$stall_every_ms"
}

# Pair spin-before: one consumer sleeping in poll() (mode wake-sleep), then the same
# with wake=spin-before and a 500 us spin budget (wake-spin-before).
pair_spin_before() {
	local common=(--width 1920 --height 1080 --fps 60 --frames "$wake_frames" --warmup "$warmup")
	core --mode wake-sleep "${common[@]}" --wake sleep
	core --mode wake-spin-before "${common[@]}" --wake spin-before --spin-budget 500
}

# The policies suite: what a consumer's policy and wait cost at 1080p60. Rounds
# of its pairs, interleaved, so that a change in the machine's load hits them
# alike and the rounds show the run-to-run spread the ratios are read against.
# Quick: a stall of 200 ms every second, so that a short run has stalls too.
suite_policies() {
	build xmem-bench-core
	local rounds=3 stall_frames=1260 stall_ms=2000 stall_every_ms=10000 wake_frames=900 round
	if [ "$quick" = 1 ]; then
		rounds=1 stall_frames=120 stall_ms=200 stall_every_ms=1000 wake_frames=120
	fi
	for ((round = 1; round <= rounds; round++)); do
		pair_stalled_spill
		pair_spin_before
	done
}

# Pair size-classes: the latency measurement of pair_xmem_core with two consumers,
# in a pool of one size class (mode classes-1) and in one of 8 (classes-8), where
# the frames' class is the last: acquire(size) and the slot lookups pass the 7
# classes of smaller slots before it.
pair_size_classes() {
	local k
	for k in 1 8; do
		core --mode "classes-$k" --width 640 --height 480 --fps 60 --frames "$latency_frames" \
			--warmup "$warmup" --consumers 2 --classes "$k"
	done
}

# The classes suite: what size classes cost the handoff. Rounds, interleaved as in
# the policies suite, so that the ratios of a round are read against the spread
# from one round to the next.
suite_classes() {
	build xmem-bench-core
	local rounds=3 round
	[ "$quick" = 1 ] && rounds=1
	for ((round = 1; round <= rounds; round++)); do
		pair_size_classes
	done
}

load_average() { cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown; }

for suite in ${suites[@]+"${suites[@]}"}; do
	records=$(mktemp)
	trap 'rm -f "$records"' EXIT
	load_before=$(load_average)
	"suite_$suite" >"$records"
	python3 bench/report.py collect --suite "$suite" --command "$invocation" --quick "$quick" \
		--build-dir "$build_dir" --platform "$platform" --load "$load_before" --load "$(load_average)" \
		--out "$results_dir/$suite.json" <"$records"
	rm -f "$records"
	python3 bench/report.py table "$results_dir/$suite.json"
done

if [ "$update_docs" = 1 ]; then
	# Every platform's results (soak runs have folders of their own, not of suites).
	results=()
	for f in "$root"/bench/results/*/*.json; do
		name=${f##*/}
		[[ " ${all_suites[*]} " == *" ${name%.json} "* ]] && results+=("$f")
	done
	[ ${#results[@]} -gt 0 ] || { echo "run.sh: no results in bench/results/*/" >&2; exit 2; }
	python3 bench/report.py docs --out docs/benchmarks.md "${results[@]}"
	echo "run.sh: wrote docs/benchmarks.md from ${#results[@]} result file(s)" >&2
else
	echo "run.sh: results in bench/results/$platform/; add --update-docs to regenerate docs/benchmarks.md" >&2
fi
exit "$failed"
