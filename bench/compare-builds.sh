#!/usr/bin/env bash
# compare-builds.sh - the same measurements from two builds of xmem, interleaved round by
# round so that a change in the machine's load hits both alike: a refactor's before/after.
#
# usage: bench/compare-builds.sh [--rounds N] [--quick] BEFORE_BUILD_DIR AFTER_BUILD_DIR
#
#   Each build dir needs bench/xmem-bench-core, bench/xmem-bench-gst and gst/'s plugin.
#   Measured, each round, each build: xmem-bench-core at 1080p60 (latency, 1 consumer),
#   1080p unthrottled with 1, 4 and 16 consumers (throughput, the owner's publish cost),
#   and xmem-bench-gst at 1080p60 (xmem, and shmsink/shmsrc from the same run's
#   GStreamer, as the yardstick). Prints, per measurement, the median over the rounds of
#   each build and AFTER/BEFORE; --quick: a few frames, to check that it runs.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=5
frames=600
tput_frames=20000
while [ $# -gt 0 ]; do
	case "$1" in
	--rounds)
		rounds=$2
		shift
		;;
	--quick) rounds=1 frames=60 tput_frames=600 ;;
	-h | --help)
		sed -n '2,12p' "$0"
		exit 0
		;;
	*) break ;;
	esac
	shift
done
if [ $# -ne 2 ]; then
	echo "usage: $0 [--rounds N] [--quick] BEFORE_BUILD_DIR AFTER_BUILD_DIR" >&2
	exit 2
fi
before=$(realpath "$1")
after=$(realpath "$2")
for b in "$before" "$after"; do
	for exe in bench/xmem-bench-core bench/xmem-bench-gst; do
		[ -x "$b/$exe" ] || { echo "$0: $b/$exe is missing (build it first)" >&2; exit 2; }
	done
done
out=$(mktemp)
trap 'rm -f "$out"' EXIT

# measure BUILD LABEL COMMAND...: one JSON line, tagged with the build and the label.
measure() {
	local build=$1 label=$2
	shift 2
	local line
	line=$(GST_PLUGIN_PATH="$build/gst" timeout -k 5 300 "$@" --json 2>/dev/null | grep '^{' | tail -1) || true
	[ -n "$line" ] || line='{"ok": false}'
	printf '%s\t%s\t%s\n' "$build" "$label" "$line" >>"$out"
}

size=(--width 1920 --height 1080)
for ((r = 1; r <= rounds; r++)); do
	echo "round $r of $rounds" >&2
	for b in "$before" "$after"; do
		# A build's first gst_init scans its plugin: not in the measurement.
		GST_PLUGIN_PATH="$b/gst" timeout 60 gst-inspect-1.0 xmemsink >/dev/null 2>&1 || true
		measure "$b" "core 1080p60 latency" "$b/bench/xmem-bench-core" "${size[@]}" --fps 60 --frames "$frames" --warmup 30
		for n in 1 4 16; do
			measure "$b" "core 1080p unthrottled, $n consumers" "$b/bench/xmem-bench-core" "${size[@]}" \
				--fps 0 --frames "$tput_frames" --warmup 100 --consumers "$n"
		done
		measure "$b" "gst 1080p60 xmem" "$b/bench/xmem-bench-gst" --pair xmem "${size[@]}" --fps 60 --frames "$frames" --warmup 30
		measure "$b" "gst 1080p60 shm" "$b/bench/xmem-bench-gst" --pair shm "${size[@]}" --fps 60 --frames "$frames" --warmup 30
	done
done

python3 - "$out" "$before" "$after" <<'PY'
import json, statistics, sys
path, before, after = sys.argv[1:4]
rows = {}
for line in open(path):
    build, label, record = line.rstrip("\n").split("\t", 2)
    rows.setdefault(label, {}).setdefault(build, []).append(json.loads(record))
fields = [("p50_us", "p50 us"), ("p99_us", "p99 us"), ("fps", "frames/s"),
          ("producer_cpu_us_per_frame", "producer CPU us/frame"), ("cpu_us_per_frame", "CPU us/frame")]
print(f"before: {before}\nafter:  {after}\n")
print(f"| measurement | figure | before (median) | after (median) | after/before |")
print(f"| --- | --- | ---: | ---: | ---: |")
for label, by_build in rows.items():
    for key, name in fields:
        values = {}
        for build in (before, after):
            got = [r[key] for r in by_build.get(build, []) if r.get("ok") and key in r]
            values[build] = statistics.median(got) if got else None
        a, b = values[before], values[after]
        if a is None and b is None:
            continue
        if "unthrottled" in label and key in ("p50_us", "p99_us"):
            continue  # latency under saturation says little
        if "60" in label and key == "fps":
            continue  # paced: the rate is the pace
        ratio = f"{b / a:.2f}" if a and b is not None else "-"
        fmt = lambda v: "failed" if v is None else f"{v:.1f}"
        print(f"| {label} | {name} | {fmt(a)} | {fmt(b)} | {ratio} |")
PY
