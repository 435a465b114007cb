#!/usr/bin/env bash
# bench/gpu-compare.sh [--quick] [--frames N] [--out FILE] - xmem against the peers that
# hand CUDA frames between processes, in one run on one GPU, as ratios to xmem:
#   device frames  NV12 in CUDA memory, 1080p and 4K, paced at 60 fps and unpaced, one and
#                  four consumers: xmem (xmemsink/xmemsrc, a device pool), GStreamer's
#                  cudaipcsink/cudaipcsrc in ipc-mode=legacy (CUDA IPC handles) and mmap
#                  (VMM file descriptors), and the in-process floor (tee to appsinks).
#                  bench/xmem-bench-gst --memory cuda: a 64-byte CLOCK_MONOTONIC stamp
#                  written into each frame's device memory by the producer and read back by
#                  each consumer (docs/benchmarks.md)
#   decode         the same pairs fed by nvh264dec (an H.264 file made here first with
#                  openh264enc): latency from the decoder's output to the consumer
#   python         xmem's Python consumer against torch.multiprocessing sending CUDA
#                  tensors (bench/python.py --pairs xmem,torch-mp: its CUDA rows), with this
#                  machine's python3 (PYTHON) and torch
#   cpu            system memory at 1080p60, one consumer: xmem, xmem with wake=spin-before,
#                  shmsink/shmsrc and the floor (bench/xmem-bench-gst)
# Every process of the device rows loads bench/cudacount (a copy-counting shim in front of
# the driver), so each row says how many whole frames each process copied on the device
# per frame handed over (frame-sized copies only: the stamps are 64 bytes).
# Columns: p50/p99 publish-to-consumer latency (us), fps, CPU us per frame of the producer
# and of each consumer, frames copied per frame (producer/consumer), the GPU memory the
# run added (device-wide, MiB), and p50 and CPU as ratios to xmem's row (above 1: xmem
# is better). Prints the table and writes every record as JSON (--out, default
# bench/results/gpu-compare-DATE.json).
#   XMEM_BUILD_DIR   the build (default build; DIR/run --compare sets the GPU pack's)
#   PYTHON           the interpreter of the python rows (default python3, then
#                    /usr/bin/python3); XMEM_PY_LIBRARY the libxmem it loads
# Exits 77 without a GPU, unless on the simulator with XMEM_BENCH_ALLOW_SIM=1 (DIR/run
# --sim --compare): then every figure is the simulator's and says nothing about a GPU,
# and the runs are short.
set -euo pipefail
cd "$(dirname "$0")/.."

build=${XMEM_BUILD_DIR:-build}
bench=$build/bench/xmem-bench-gst
counter=$build/bench/cudacount/libcuda.so.1
frames=300
quick=0
out=
while [ $# -gt 0 ]; do
	case $1 in
	--quick) quick=1 ;;
	--frames) frames=$2 && shift ;;
	--out) out=$2 && shift ;;
	*) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2 && exit 2 ;;
	esac
	shift
done

sim=0
case "${XMEM_CUDA_DRIVER:-}:${LD_LIBRARY_PATH:-}" in *cudasim*) sim=1 ;; esac
if [ $sim = 1 ]; then
	[ "${XMEM_BENCH_ALLOW_SIM:-}" = 1 ] || {
		echo "gpu-compare.sh: on the CUDA simulator: timings would mean nothing (XMEM_BENCH_ALLOW_SIM=1 runs it anyway)" >&2
		exit 77
	}
	quick=1
elif ! command -v nvidia-smi >/dev/null 2>&1; then
	echo "gpu-compare.sh: no GPU here (no nvidia-smi): this benchmark is for a GPU machine (DIR/run --sim --compare checks it on the simulator)" >&2
	exit 77
fi
[ $quick = 1 ] && frames=60
for f in "$bench" "$counter"; do
	[ -x "$f" ] || [ -f "$f" ] || {
		echo "gpu-compare.sh: $f is missing: build with the CUDA feature and GStreamer's CUDA library" >&2
		exit 2
	}
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/xmem-gpu-compare.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
export XDG_RUNTIME_DIR=$tmp
# One registry for the run, written with the counting shim in front of the driver.
export GST_REGISTRY_1_0=$tmp/registry.bin
export GST_PLUGIN_PATH=$build/gst${GST_PLUGIN_PATH:+:$GST_PLUGIN_PATH}
if [ $sim = 1 ]; then
	real_driver=$(realpath "${XMEM_CUDA_DRIVER:-$build/tests/cudasim/libcuda.so.1}")
elif [ -e "${XMEM_PACK:-/nonexistent}/.nvidia/libcuda.so.1" ]; then
	real_driver=$(realpath "$XMEM_PACK/.nvidia/libcuda.so.1") # the one DIR/run found
else
	real_driver= # the shim looks for the machine's own
fi
: "${out:=bench/results/gpu-compare-$(date -u +%Y%m%dT%H%MZ)$([ $sim = 1 ] && echo -sim).json}"
mkdir -p "$(dirname "$out")"

# json_field KEY: the value of "KEY" in the one JSON object on stdin (flat fields only).
json_field() {
	sed -n "s/.*\"$1\": *\(\"[^\"]*\"\|[^,}]*\).*/\1/p" | head -1 | tr -d '"'
}

records=$tmp/records.jsonl
: >"$records"
n=0
# measure GROUP ARGS...: one run of xmem-bench-gst with every process behind the copy
# counter; appends its record, with the copies, to $records.
measure() {
	local group=$1
	shift
	n=$((n + 1))
	local counts=$tmp/counts-$n.jsonl line rc=0
	: >"$counts"
	line=$(env XMEM_CUDACOUNT_OUT="$counts" ${real_driver:+XMEM_CUDACOUNT_DRIVER=$real_driver} \
		XMEM_CUDA_DRIVER="$(realpath "$counter")" \
		LD_LIBRARY_PATH="$(realpath "$(dirname "$counter")")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
		timeout -k 10 300 "$bench" --json "$@" 2>"$tmp/err-$n") || rc=$?
	if [ "${line:0:1}" != "{" ]; then
		local why pair=${*#*--pair }
		why=$(tail -n 3 "$tmp/err-$n" | tr '\n"\\' '  /' | cut -c1-300)
		echo "{\"group\": \"$group\", \"pair\": \"${pair%% *}\", \"args\": \"$*\", \"ok\": false, \"exit\": $rc, \"error\": \"exit $rc: $why\"}" >>"$records"
		return 0
	fi
	if [ $rc != 0 ] && [ -z "$(echo "$line" | json_field p50_us)" ]; then
		# Its own record says why (unavailable: exit 77; failed: "ok": false).
		echo "${line%\}}, \"group\": \"$group\", \"exit\": $rc}" >>"$records"
		return 0
	fi
	# Whole frames copied on the device per frame handed over, by role.
	local total frame_bytes prod cons
	total=$(($(echo "$line" | json_field frames) + $(echo "$line" | json_field warmup)))
	frame_bytes=$(echo "$line" | json_field frame_bytes)
	prod=$(copies producer "$counts" "$total" "$frame_bytes")
	cons=$(copies consumer "$counts" "$total" "$frame_bytes")
	echo "${line%\}}, \"group\": \"$group\", \"exit\": $rc, \"producer_frame_copies\": $prod, \"consumer_frame_copies\": $cons}" >>"$records"
}

# copies ROLE COUNTS FRAMES FRAME_BYTES: the bytes the processes of ROLE (producer, or
# consumer: their mean) copied on the device in frame-sized copies (bench/cudacount's
# frame_bytes_total), in whole frames, per frame pushed.
copies() {
	awk -v role="$1" -v frames="$3" -v fb="$4" '
		!/"argv0":"[^"]*xmem-bench-gst"/ { next }
		{ consumer = index($0, "--role consumer") > 0 }
		(role == "consumer") != consumer { next }
		match($0, /"frame_bytes_total":[0-9]+/) { procs++; bytes += substr($0, RSTART + 20, RLENGTH - 20) }
		END {
			if (!procs || !frames || !fb) { print "null"; exit }
			printf "%.2f", bytes / procs / frames / fb
		}' "$2"
}

echo "# gpu-compare $(date -u +%Y-%m-%dT%H:%MZ): $([ $sim = 1 ] && echo 'CUDA SIMULATOR: these figures say nothing about a GPU' ||
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"

# Device frames.
for res in 1920x1080 3840x2160; do
	for fps in 60 0; do
		for consumers in 1 4; do
			for pair in xmem cudaipc-legacy cudaipc-mmap floor; do
				measure "cuda ${res} ${fps}fps ${consumers}c" --memory cuda --pair "$pair" \
					--width "${res%x*}" --height "${res#*x}" --fps "$fps" --consumers "$consumers" \
					--frames "$frames"
			done
		done
	done
done

# Decode into each.
h264=$tmp/in.h264
if gst-launch-1.0 -q videotestsrc num-buffers=$((frames + 60)) pattern=ball ! \
	video/x-raw,width=1920,height=1080,framerate=60/1 ! openh264enc ! h264parse ! \
	video/x-h264,stream-format=byte-stream ! filesink location="$h264" >"$tmp/enc.log" 2>&1; then
	for pair in xmem cudaipc-legacy cudaipc-mmap floor; do
		measure "decode 1920x1080 1c" --memory cuda --pair "$pair" --source "h264=$h264" \
			--width 1920 --height 1080 --fps 0 --consumers 1 --frames "$frames"
	done
else
	echo "{\"group\": \"decode 1920x1080 1c\", \"ok\": false, \"error\": \"unavailable: no H.264 file: $(tail -n 1 "$tmp/enc.log" | tr '"\\' ' /')\"}" >>"$records"
fi

# System memory, the CPU latency pair.
for pair in xmem xmem-spin shm floor; do
	measure "cpu 1920x1080 60fps 1c" --pair "$pair" --width 1920 --height 1080 --fps 60 --consumers 1 \
		--frames "$frames"
done

# Python: xmem's consumer against torch.multiprocessing.
py=${PYTHON:-}
if [ -z "$py" ]; then
	for p in python3 /usr/bin/python3; do
		command -v "$p" >/dev/null 2>&1 && "$p" -c 'import torch, numpy' 2>/dev/null && py=$p && break
	done
fi
if [ -n "$py" ]; then
	env PYTHONPATH="$PWD/python" XMEM_LIBRARY="${XMEM_PY_LIBRARY:-$(realpath "$build")/lib/libxmem.so.0}" \
		${XMEM_PY_CUDA_DRIVER:+XMEM_CUDA_DRIVER=$XMEM_PY_CUDA_DRIVER} \
		timeout -k 10 600 "$py" bench/python.py --json --pairs xmem,torch-mp --width 1920 --height 1080 \
		--fps 60 --frames "$frames" 2>"$tmp/py.err" | sed 's/}$/, "group": "python 1920x1080 60fps"}/' >>"$records" ||
		echo "{\"group\": \"python 1920x1080 60fps\", \"ok\": false, \"error\": \"$(tail -n 2 "$tmp/py.err" | tr '\n"\\' '  /')\"}" >>"$records"
else
	echo '{"group": "python 1920x1080 60fps", "ok": false, "error": "unavailable: no python3 with torch and numpy here"}' >>"$records"
fi

# The table: each row against the xmem row of its group (python rows: of its device).
awk '
	function f(key,   v) {
		if (!match($0, "\"" key "\": *(\"[^\"]*\"|[^,}]*)")) return ""
		v = substr($0, RSTART, RLENGTH); sub(/^"[^"]*": */, "", v); gsub(/"/, "", v); return v
	}
	function num(v) { return v == "" || v == "null" ? "-" : v }
	function ratio(a, b) { return (a == "" || b == "" || a + 0 == 0) ? "-" : sprintf("%.2f", b / a) }
	# A run with figures is shown even where it lost frames (cudaipcsrc keeps only its
	# newest few: unpaced, it drops what its consumer has not taken).
	function failed() { return f("available") == "false" || (f("ok") == "false" && f("p50_us") == "") }
	{
		g = f("group"); if (f("device") != "") g = g " " f("device")
		rows[NR] = $0; group[NR] = g
		if (f("pair") == "xmem" && !failed() && !(g in base)) {
			base[g] = f("p50_us"); basecpu[g] = f("cpu_us_per_frame")
		}
	}
	END {
		printf "%-28s %-15s %9s %9s %7s %9s %9s %6s %6s %7s %5s %6s %6s\n", "group", "pair", "p50 us", "p99 us",
			"fps", "prod cpu", "cons cpu", "copies", "(cons)", "GPU MiB", "lost", "p50 x", "cpu x"
		for (i = 1; i <= NR; i++) {
			$0 = rows[i]; g = group[i]
			if (failed()) {
				e = f("error"); if (length(e) > 150) e = "..." substr(e, length(e) - 146)
				printf "%-28s %-15s %s\n", g, f("pair"), e; continue
			}
			printf "%-28s %-15s %9s %9s %7s %9s %9s %6s %6s %7s %5s %6s %6s\n", g, f("pair"), num(f("p50_us")),
				num(f("p99_us")), num(f("fps")), num(f("producer_cpu_us_per_frame")),
				num(f("consumers_cpu_us_per_frame") f("consumer_cpu_us_per_frame")),
				num(f("producer_frame_copies")), num(f("consumer_frame_copies")), num(f("gpu_mem_delta_mib")),
				num(f("dropped") + f("corrupt")), ratio(base[g], f("p50_us")), ratio(basecpu[g], f("cpu_us_per_frame"))
		}
		print "lost: frames dropped or corrupt (a run that lost frames is still shown); copies: whole frames copied on the device per frame, producer (consumer)"
		print "p50 x, cpu x: p50 latency and CPU per frame (all processes) of each row over the xmem row of its group (above 1: xmem is better)"
	}' "$records"

{
	echo "{\"suite\": \"gpu-compare\", \"date\": \"$(date -u '+%Y-%m-%d %H:%M UTC')\", \"simulator\": $([ $sim = 1 ] && echo true || echo false),"
	echo " \"gpu\": \"$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 || true)\", \"frames\": $frames,"
	echo " \"measurements\": ["
	sed '$!s/$/,/' "$records"
	echo " ]}"
} >"$out"
echo "# written to $out"
