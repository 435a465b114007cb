#!/bin/bash
# run.sh SECONDS_PER_HARNESS - builds the libFuzzer harnesses (clang, ASan + UBSan)
# and fuzzes each for SECONDS_PER_HARNESS, starting from its seed corpus and its
# regressions (copied: the source tree is never written). Fails on any crash, leak,
# timeout or out-of-memory, and prints the path of the input that caused it.
# Environment: BUILD (build directory, default build-fuzz in the repository root),
# HARNESSES (default: all), WORK (where corpora and artifacts go, default a new
# temporary directory, kept when something failed), JOBS (harnesses run at once).
set -euo pipefail

secs=${1:?usage: tests/fuzz/run.sh SECONDS_PER_HARNESS}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${BUILD:-$root/build-fuzz}
harnesses=${HARNESSES:-protocol subscriber snapshot format}
work=${WORK:-$(mktemp -d /tmp/xmem-fuzz-run.XXXXXX)}
jobs=${JOBS:-1}

# The longest input each harness reads: a Welcome and its ArenaFds messages; a
# control segment image and a script; a format string after 13 bytes.
max_len() {
	case $1 in
	protocol) echo 12288 ;;
	subscriber | snapshot) echo 65536 ;;
	format) echo 4096 ;;
	*) echo 4096 ;;
	esac
}

cd "$root"
. tools/bootstrap.sh
xmem_install_packages meson ninja-build pkg-config libgtest-dev clang libclang-rt-14-dev
CC=clang CXX=clang++ xmem_configure "$build" -Dfuzz=true -Dtests=enabled -Dwerror=true \
	-Db_sanitize=address,undefined -Db_lundef=false -Dgstreamer=disabled
targets=()
for h in $harnesses; do
	targets+=("tests/fuzz/fuzz-$h")
done
meson compile -C "$build" "${targets[@]}"

export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}

fuzz_one() {
	local h=$1
	local corpus="$work/corpus-$h"
	mkdir -p "$corpus"
	cp -r "$here/corpus/$h/." "$corpus/"
	local log="$work/$h.log"
	local rc=0
	"$build/tests/fuzz/fuzz-$h" -max_total_time="$secs" -max_len="$(max_len "$h")" -timeout=30 \
		-rss_limit_mb=4096 -error_exitcode=1 -print_final_stats=1 -artifact_prefix="$work/$h-" \
		"$corpus" "$here/regressions/$h" >"$log" 2>&1 || rc=$?
	local execs cov
	execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | tail -1 | grep -o '[0-9]*$' || true)
	cov=$(grep -E '^#[0-9]+' "$log" | tail -1 | grep -oE 'cov: [0-9]+ ft: [0-9]+' || true)
	if [ "$rc" -ne 0 ]; then
		echo "FAIL $h (exit $rc): ${execs:-?} executions, $cov"
		grep -E 'ERROR: |runtime error|SUMMARY|Test unit written|property violated|ALARM|out-of-memory' "$log" | head -20
		echo "  log: $log"
		return 1
	fi
	echo "ok   $h: ${execs:-?} executions in ${secs}s, $cov, corpus $(ls "$corpus" | wc -l) inputs"
}

failed=0
running=0
pids=()
names=()
for h in $harnesses; do
	fuzz_one "$h" &
	pids+=($!)
	names+=("$h")
	running=$((running + 1))
	if [ "$running" -ge "$jobs" ]; then
		wait "${pids[0]}" || failed=1
		pids=("${pids[@]:1}")
		names=("${names[@]:1}")
		running=$((running - 1))
	fi
done
for p in "${pids[@]}"; do
	wait "$p" || failed=1
done
if [ "$failed" -ne 0 ]; then
	echo "fuzzing found a problem: inputs and logs are in $work"
	exit 1
fi
[ -n "${WORK:-}" ] || rm -rf "$work"
echo "fuzzing passed: $harnesses, ${secs}s each"
