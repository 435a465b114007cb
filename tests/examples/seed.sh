#!/usr/bin/env bash
# seed.sh EXAMPLE [gpu] - runs examples/seed.cpp (the seed design's flow with its C++ names)
# in a runtime directory of its own and checks what it says: both consumers got every frame
# by meta index, and section 7's copies ran (GPU 0 -> GPU 1 too where there are two
# devices). With "gpu": against the real driver, 77 (skipped) without a GPU.
set -u
example=$1
mode=${2:-sim}
if [ "$mode" = gpu ]; then
	unset XMEM_CUDA_DRIVER
	if ! { [ -e /dev/nvidiactl ] && ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1'; }; then
		echo "no GPU (no /dev/nvidiactl or libcuda.so.1): skipped"
		exit 77
	fi
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export XDG_RUNTIME_DIR=$dir
out=$dir/out
timeout 100 "$example" "seed-$$" 32 >"$out" 2>&1
status=$?
cat "$out"
[ "$status" -eq 0 ] || { echo "FAIL: exit status $status"; exit 1; }
for k in 0 1; do
	grep -q "consumer $k: 32 frames by meta index" "$out" || { echo "FAIL: consumer $k"; exit 1; }
done
grep -q "CPU -> CUDA: buffer" "$out" || { echo "FAIL: no CPU -> CUDA copy"; exit 1; }
if [ "$mode" = sim ]; then
	grep -q "GPU 0 -> GPU 1: buffer" "$out" || { echo "FAIL: no GPU 0 -> GPU 1 copy"; exit 1; }
fi
grep -q "all right" "$out" || { echo "FAIL"; exit 1; }
echo PASS
