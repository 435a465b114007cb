#!/usr/bin/env bash
# DIR/run - the GPU pack's one entry point (tools/gpu-pack.sh makes DIR and copies this
# file there as DIR/run). Run from the tree the pack was made from (or name it with
# XMEM_SOURCE): the tests read their scripts and data there.
#
#   DIR/run --gpu [NAME...]   every test meant for a GPU (meson's *-gpu tests), each with
#                             its own environment and GStreamer registry; NAME: only those
#                             whose names contain it
#   DIR/run --python [ARGS]   python/tests with this machine's python3 (torch, CuPy,
#                             onnxruntime) and the pack's Debian 12 libxmem; ARGS go to pytest
#   DIR/run --compare [ARGS]  bench/gpu-compare.sh: xmem against cudaipcsink/cudaipcsrc and
#                             torch.multiprocessing, one table (ARGS go to it)
#   DIR/run --env             the environment for gst-launch-1.0 and the build's programs
#                             by hand: eval "$(DIR/run --env)"
#   DIR/run --list            the tests --gpu runs
#   DIR/run --test NAME...    any of the build's tests by exact name (the *-sim ones too)
#   DIR/run --sim ...         any of the above against the CUDA simulator instead of the
#                             driver: a -gpu test's -sim twin where there is one, else the
#                             test with the simulator as its driver. It proves the pack and
#                             xmem's logic, never a GPU's behaviour.
# Prints one line a test, the tail of what failed or skipped, and "N passed, N failed,
# N skipped"; exits 1 when one failed.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src=${XMEM_SOURCE:-}
if [ -z "$src" ]; then
	for d in "$(dirname "$here")" "$PWD"; do
		[ -f "$d/meson.build" ] && [ -d "$d/tests" ] && src=$d && break
	done
fi
[ -n "$src" ] || {
	echo "run: cannot find the source tree (run from it, or set XMEM_SOURCE)" >&2
	exit 2
}
build=$here/build
root=$here/root
loader=$here/lib/ld-linux-x86-64.so.2
gstlib=$root/usr/lib/x86_64-linux-gnu/gstreamer-1.0
sim=0
state=$(mktemp -d "${TMPDIR:-/tmp}/xmem-gpu-run.XXXXXX")
trap 'rm -rf "$state"' EXIT

# The pack's programs take its loader where the pack lies now (a path in PT_INTERP must be
# absolute): set once per place, with the patchelf the pack carries, run by that loader.
relocate() {
	[ "$(cat "$here/.relocated" 2>/dev/null)" = "$here" ] && return 0
	local f
	while IFS= read -r f; do
		"$loader" --library-path "$here/lib" "$here/bin/patchelf" --set-interpreter "$loader" "$here/$f" || {
			echo "run: cannot set the loader of $f" >&2
			exit 2
		}
	done <"$here/executables"
	echo "$here" >"$here/.relocated"
}

# What every process of the pack needs besides its RUNPATH: Debian 13's GStreamer where
# the pack has it, the packed tools before the machine's, a locale glibc has built in.
export GST_PLUGIN_SYSTEM_PATH_1_0=$gstlib
export GST_PLUGIN_SCANNER_1_0=$root/usr/lib/x86_64-linux-gnu/gstreamer1.0/gstreamer-1.0/gst-plugin-scanner
export PATH=$root/usr/bin:$PATH
export LC_ALL=C.UTF-8
unset GST_REGISTRY GST_REGISTRY_1_0

# The simulator's environment: its driver first on the library path, for xmem and nvcodec.
sim_env() {
	local dir=$1
	export XMEM_CUDA_DRIVER=$dir/libcuda.so.1
	export LD_LIBRARY_PATH=$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
}

moved() {
	local s=$1
	s=${s//@BUILD@/$build}
	s=${s//@SRC@/$src}
	s=${s//@ROOT@/$root}
	printf '%s' "$s"
}

info() { sed -n "s/^$2=//p" "$here/tests/$1/info"; }

passed=0 failed=0 skipped=0
run_test() {
	local name=$1 extra_sim=$2
	local cmd=() env=() a kv
	while IFS= read -r -d '' a; do cmd+=("$(moved "$a")"); done <"$here/tests/$name/cmd"
	while IFS= read -r -d '' kv; do env+=("$(moved "$kv")"); done <"$here/tests/$name/env"
	env+=("GST_REGISTRY_1_0=$state/registry-$name.bin" "MESON_TEST_ITERATION=1")
	local ld="" e
	for e in "${env[@]}"; do
		case $e in LD_LIBRARY_PATH=*) ld=${e#LD_LIBRARY_PATH=} ;; esac
	done
	if [ "$extra_sim" = 1 ]; then
		env+=("XMEM_CUDA_DRIVER=$build/tests/cudasim/libcuda.so.1" "LD_LIBRARY_PATH=$build/tests/cudasim${ld:+:$ld}")
	elif [ -n "$driver_dir" ]; then
		env+=("LD_LIBRARY_PATH=${ld:+$ld:}$driver_dir")
	fi
	local t0 rc out=$state/out-$name
	t0=$(date +%s.%N)
	if [ "${cmd[0]:0:1}" = / ] && [ ! -x "${cmd[0]}" ]; then
		# A test run by an interpreter this machine lacks (meson's /usr/bin/python3).
		echo "skipped: ${cmd[0]} is not on this machine" >"$out"
		rc=77
	else
		(cd "$(moved "$(info "$name" workdir)")" && exec env "${env[@]}" timeout -k 10 "$(info "$name" timeout)" "${cmd[@]}") \
			>"$out" 2>&1 </dev/null
		rc=$?
	fi
	local dt word
	dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
	if [ $rc = 77 ]; then
		word=SKIP skipped=$((skipped + 1))
	elif { [ $rc = 0 ] && [ "$(info "$name" should_fail)" = 0 ]; } ||
		{ [ $rc != 0 ] && [ "$(info "$name" should_fail)" = 1 ]; }; then
		word=ok passed=$((passed + 1))
	else
		word=FAIL failed=$((failed + 1))
		[ $rc = 124 ] && rc="timeout after $(info "$name" timeout) s"
	fi
	printf '%-4s %s (%s s)%s\n' "$word" "$name" "$dt" "$([ $word = ok ] || echo " [$rc]")"
	case $word in
	FAIL) tail -n 40 "$out" | sed 's/^/    /' ;;
	SKIP) tail -n 6 "$out" | sed 's/^/    /' ;;
	esac
}

gpu_tests() {
	local t
	for t in "$here"/tests/*-gpu; do
		t=$(basename "$t")
		if [ $# -gt 0 ]; then
			local n keep=0
			for n in "$@"; do [[ $t == *"$n"* ]] && keep=1; done
			[ $keep = 1 ] || continue
		fi
		echo "$t"
	done
}

summary() {
	echo "$passed passed, $failed failed, $skipped skipped"
	[ $failed = 0 ]
}

[ $# -gt 0 ] || set -- --help
if [ "$1" = --sim ]; then
	sim=1
	shift
	[ $# -gt 0 ] || set -- --help
fi
relocate

# The machine's own NVIDIA libraries, where its ldconfig lists them, linked from a folder
# of their own on the library path: Debian 13's loader then finds them whatever that
# machine's ld.so.cache and library folders are like, and nothing else of the machine's
# comes with them (its library folder itself on the path would put its GStreamer and C
# library before the pack's).
driver_dir=
if [ $sim = 0 ] && command -v ldconfig >/dev/null 2>&1; then
	for lib in libcuda.so.1 libnvcuvid.so.1 libnvidia-encode.so.1 libnvidia-ptxjitcompiler.so.1; do
		path=$(ldconfig -p 2>/dev/null | awk -v lib="$lib" '$1 == lib && /x86-64/ { print $NF; exit }')
		[ -n "$path" ] || continue
		mkdir -p "$here/.nvidia"
		ln -sf "$path" "$here/.nvidia/$lib"
		driver_dir=$here/.nvidia
	done
	[ -z "$driver_dir" ] || export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$driver_dir
fi
mode=$1
shift
case $mode in
--gpu | --list)
	for t in $(gpu_tests "$@"); do
		if [ "$mode" = --list ]; then
			echo "$t"
		elif [ $sim = 1 ] && [ -d "$here/tests/${t%-gpu}-sim" ]; then
			run_test "${t%-gpu}-sim" 0
		else
			run_test "$t" $sim
		fi
	done
	[ "$mode" = --list ] || summary
	;;
--test)
	for t in "$@"; do
		[ -d "$here/tests/$t" ] || {
			echo "run: no test named $t (ls $here/tests)" >&2
			exit 2
		}
		run_test "$t" $sim
	done
	summary
	;;
--python)
	# This machine's python3 with its own libraries; only libxmem (and the simulator)
	# from the pack, built on Debian 12 for an older C library.
	py=${PYTHON:-python3}
	export PYTHONPATH=$src/python${PYTHONPATH:+:$PYTHONPATH}
	export XMEM_LIBRARY=$here/py/libxmem.so.0
	# The tests that run gst-launch-1.0 run the pack's, with the pack's plugin, through
	# wrappers that give GStreamer's variables to those processes only: a GStreamer the
	# machine's Python loads itself (OpenCV's) must not meet the pack's plugins.
	mkdir -p "$state/bin"
	for tool in gst-launch-1.0 gst-inspect-1.0; do
		printf '#!/bin/sh\nGST_PLUGIN_SYSTEM_PATH_1_0=%s GST_PLUGIN_SCANNER_1_0=%s GST_PLUGIN_PATH=%s GST_REGISTRY_1_0=%s exec %s "$@"\n' \
			"'$GST_PLUGIN_SYSTEM_PATH_1_0'" "'$GST_PLUGIN_SCANNER_1_0'" "'$build/gst'" "'$state/registry-python.bin'" \
			"'$root/usr/bin/$tool'" >"$state/bin/$tool"
		chmod +x "$state/bin/$tool"
	done
	unset GST_PLUGIN_SYSTEM_PATH_1_0 GST_PLUGIN_SCANNER_1_0
	export PATH=$state/bin:${PATH#"$root/usr/bin:"}
	[ $sim = 1 ] && sim_env "$here/py/cudasim"
	echo "+ $py -m pytest -q -rs $src/python/tests $*"
	cd "$src" && "$py" -m pytest -q -rs "$src/python/tests" "$@"
	exit
	;;
--compare)
	export XMEM_BUILD_DIR=$build XMEM_PACK=$here
	if [ $sim = 1 ]; then
		sim_env "$build/tests/cudasim"
		export XMEM_BENCH_ALLOW_SIM=1 XMEM_PY_CUDA_DRIVER=$here/py/cudasim/libcuda.so.1
	fi
	export XMEM_PY_LIBRARY=$here/py/libxmem.so.0
	exec bash "$src/bench/gpu-compare.sh" "$@"
	;;
--env)
	echo "export PATH='$PATH'"
	echo "export LC_ALL=C.UTF-8"
	echo "export GST_PLUGIN_SYSTEM_PATH_1_0='$GST_PLUGIN_SYSTEM_PATH_1_0'"
	echo "export GST_PLUGIN_SCANNER_1_0='$GST_PLUGIN_SCANNER_1_0'"
	echo "export GST_PLUGIN_PATH='$build/gst'"
	echo "export GST_REGISTRY_1_0='$here/registry-by-hand$([ $sim = 1 ] && echo -sim).bin'"
	if [ $sim = 1 ]; then
		echo "export XMEM_CUDA_DRIVER='$build/tests/cudasim/libcuda.so.1'"
		echo "export LD_LIBRARY_PATH='$build/tests/cudasim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}'"
	elif [ -n "$driver_dir" ]; then
		echo "export LD_LIBRARY_PATH='$LD_LIBRARY_PATH'"
	fi
	;;
*)
	sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
	[ "$mode" = --help ] || exit 2
	;;
esac
