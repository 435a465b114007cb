#!/usr/bin/env bash
# run.sh - runs xmem's benchmarks, prints a table, writes bench/results/<suite>.json
# and, with --update-docs, regenerates docs/benchmarks.md from those files.
#
# usage: bench/run.sh [--update-docs] [--quick] [--build-dir DIR] [SUITE...]
#
#   SUITE          core (the default, and the only one so far)
#   --update-docs  rewrite docs/benchmarks.md from bench/results/*.json
#   --quick        a few frames per measurement: checks that everything runs,
#                  the numbers are not worth publishing (the JSON says quick)
#   --build-dir    the Meson build directory (default: build, as tests/run.sh)
#
# Each suite is one function that runs its measured pairs; each measurement
# prints exactly one JSON object on one line. A new pair (say xmemsink against
# shmsink) is a new function and a new suite name, nothing else changes.
# The pairs and suites are called by name (suite_$suite), which shellcheck cannot see.
# shellcheck disable=SC2317
set -euo pipefail

cd "$(dirname "$0")/.."
root=$PWD
invocation="bench/run.sh${*:+ $*}"

build_dir=build
update_docs=0
quick=0
suites=()
while [ $# -gt 0 ]; do
	case "$1" in
	--update-docs) update_docs=1 ;;
	--quick) quick=1 ;;
	--build-dir)
		[ $# -ge 2 ] || { echo "run.sh: --build-dir needs a directory" >&2; exit 2; }
		build_dir=$2
		shift
		;;
	-h | --help)
		sed -n '4,15p' "$0" | sed 's/^# \{0,1\}//'
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
[ ${#suites[@]} -gt 0 ] || suites=(core)

results_dir=$root/bench/results
mkdir -p "$results_dir"

# Sizes every frame-size-dependent measurement runs at.
sizes="640x480 1920x1080 3840x2160"

if [ "$quick" = 1 ]; then
	latency_frames=60 fanout_frames=30 throughput_frames=2000 warmup=20
else
	latency_frames=600 fanout_frames=300 throughput_frames=100000 warmup=60
fi

build() {
	if [ ! -f "$build_dir/build.ninja" ]; then
		meson setup "$build_dir" >&2
	fi
	# A no-op when up to date; rebuilds a stale binary rather than measure it.
	meson compile -C "$build_dir" xmem-bench-core >&2
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
	pair_xmem_core
	pair_eventfd_memfd
}

build
for suite in "${suites[@]}"; do
	if ! declare -F "suite_$suite" >/dev/null; then
		echo "run.sh: unknown suite '$suite'" >&2
		exit 2
	fi
	records=$(mktemp)
	trap 'rm -f "$records"' EXIT
	"suite_$suite" >"$records"
	python3 bench/report.py collect --suite "$suite" --command "$invocation" --quick "$quick" \
		--build-dir "$build_dir" \
		--out "$results_dir/$suite.json" <"$records"
	rm -f "$records"
	python3 bench/report.py table "$results_dir/$suite.json"
done

if [ "$update_docs" = 1 ]; then
	python3 bench/report.py docs --out docs/benchmarks.md "$results_dir"/*.json
	echo "run.sh: wrote docs/benchmarks.md" >&2
else
	echo "run.sh: results in bench/results/; add --update-docs to regenerate docs/benchmarks.md" >&2
fi
exit "$failed"
