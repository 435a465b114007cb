#!/usr/bin/env bash
# bench/soak.sh [DURATION] [soak.py options] - the soak benchmark: an xmemsink producer
# at 1080p60 (videotestsrc is-live=true pattern=solid-color, NV12) runs DURATION seconds
# (default 3600) while xmemsrc and Python-module consumers come, go, stall (SIGSTOP,
# SIGCONT) and are SIGKILLed on a seeded random schedule. The producer's RSS, fds and
# threads and the pool's slots, consumers and frames are sampled into samples.csv,
# drawn into soak.png, and judged flat or growing (the rule: bench/soak.py).
# Exit status 0 when all is flat and the end is clean, 1 when not.
#
#   bench/soak.sh 180                      the short run CI can afford (about 3 min)
#   bench/soak.sh 3600 --seed 42           an hour, replaying schedule 42
#   bench/soak.sh 180 --inject-leak        shows the verdict failing: consumers that
#                                          stall forever keep slots and records
#   bench/soak.sh --self-test              the verdict on synthetic series only
#
#   XMEM_SOAK_OUT=dir    the output directory (default bench/results/soak-<date>)
#   XMEM_SOAK_SEED=N     the schedule's seed (default: random, printed)
#   XMEM_BUILD_DIR=dir   the build directory (default: build)
#   XMEM_SKIP_SETUP=1    use that build as it is: no package install, no configure or compile
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=tools/bootstrap.sh
. tools/bootstrap.sh

duration=3600
if [ $# -gt 0 ] && [[ "$1" =~ ^[0-9]+$ ]]; then
	duration=$1
	shift
fi
case "${1:-}" in
-h | --help)
	sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'
	exit 0
	;;
esac

build=${XMEM_BUILD_DIR:-build}
if [ -z "${XMEM_SKIP_SETUP:-}" ]; then
	xmem_install_packages "${XMEM_PACKAGES[@]}"
	if ! log=$({ xmem_configure "$build" && meson compile -C "$build" gstxmem xmem-inspect xmem; } 2>&1); then
		printf '%s\n' "$log" >&2
		echo "soak.sh: the build failed" >&2
		exit 2
	fi
fi
for f in "$build/gst/libgstxmem.so" "$build/tools/xmem-inspect" "$build/lib/libxmem.so.0"; do
	if [ ! -e "$f" ]; then
		echo "soak.sh: $f is missing (build it, or leave XMEM_SKIP_SETUP unset)" >&2
		exit 2
	fi
done
xmem_gst_env "$(realpath --relative-to="$PWD" "$build")"
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
XMEM_LIBRARY=$(realpath "$build")/lib/libxmem.so.0
export XMEM_LIBRARY

args=(--duration "$duration" --build-dir "$build")
[ -z "${XMEM_SOAK_OUT:-}" ] || args+=(--out "$XMEM_SOAK_OUT")
[ -z "${XMEM_SOAK_SEED:-}" ] || args+=(--seed "$XMEM_SOAK_SEED")
exec "${XMEM_PYTHON:-/usr/bin/python3}" bench/soak.py "${args[@]}" "$@"
