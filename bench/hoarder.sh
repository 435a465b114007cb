#!/usr/bin/env bash
# bench/hoarder.sh [SECONDS] - one consumer that keeps frames beside a healthy one (issue
# 35's case): an xmemsink producer at 640x480 30 fps with 8 slots; a keeper, `xmemsrc !
# queue (unbounded) ! identity sleep-time=200000 ! fakesink`; and a healthy `xmemsrc !
# fpsdisplaysink`. Run twice: with the keeper's default cap (max-held 0: half the pool,
# at least its queue and one) and with no cap in effect (max-held 8, the whole pool, as
# before the cap existed). Prints the healthy consumer's fps (median and lowest of its
# half-second reports) and the producer's published rate for each.
#
#   XMEM_BUILD_DIR=dir   the build directory (default: build), built already
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=tools/bootstrap.sh
. tools/bootstrap.sh
seconds=${1:-10}
build=${XMEM_BUILD_DIR:-build}
if [ ! -e "$build/gst/libgstxmem.so" ]; then
	echo "hoarder.sh: $build/gst/libgstxmem.so is missing: build first (tests/run.sh)" >&2
	exit 2
fi
xmem_gst_env "$(realpath --relative-to="$PWD" "$build")"
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-$(mktemp -d)}
out=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$out"' EXIT

run() { # CAP: the keeper's max-held
	local cap=$1 pool=hoarder-$$-$1
	gst-launch-1.0 -q videotestsrc is-live=true ! video/x-raw,format=NV12,width=640,height=480,framerate=30/1 ! \
		xmemsink name=sink pool-name="$pool" buffers=8 >/dev/null 2>&1 &
	local producer=$!
	sleep 1
	gst-launch-1.0 -q xmemsrc pool-name="$pool" max-held="$cap" ! \
		queue max-size-buffers=0 max-size-time=0 max-size-bytes=0 ! identity sleep-time=200000 ! \
		fakesink >/dev/null 2>&1 &
	local keeper=$!
	sleep 1
	timeout -s INT "$seconds" gst-launch-1.0 -v xmemsrc pool-name="$pool" ! \
		fpsdisplaysink video-sink=fakesink text-overlay=false sync=false >"$out/healthy-$cap.log" 2>&1 || true
	local published
	published=$("$build/tools/xmem-inspect" --json "$pool" 2>/dev/null |
		/usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["published"])' || echo "?")
	kill "$keeper" "$producer" 2>/dev/null || true
	wait "$keeper" "$producer" 2>/dev/null || true
	/usr/bin/python3 - "$out/healthy-$cap.log" "$cap" "$published" "$seconds" <<'EOF'
import re, statistics, sys
log, cap, published, seconds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
fps = [float(m) for m in re.findall(r"current: ([0-9.]+)", open(log, errors="replace").read())]
label = "default cap" if cap == "0" else "max-held %s (no cap in effect)" % cap
if not fps:
    print("%-32s healthy: no fps reports (see %s)" % (label, log))
else:
    print("%-32s healthy fps median %5.1f, lowest %5.1f over %d reports; producer %s frames in %d s"
          % (label, statistics.median(fps), min(fps), len(fps), published, seconds + 2))
EOF
}

run 0
run 8
