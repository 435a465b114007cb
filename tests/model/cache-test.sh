#!/usr/bin/env bash
# tests/model/cache-test.sh - the model's result cache (README.md, "The result cache"):
# check.sh on a copy of this folder with a tiny model added, a cache of its own.
#   cache-test.sh [WORK_PARENT]   default: $TMPDIR or /tmp
# A run that passed is reused; a changed model, define or compiler flag reruns; a
# failure is never stored; XMEM_MODEL_CACHE=0 reruns. Exits 77 without spin.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
if ! command -v spin >/dev/null 2>&1; then
	echo "spin is not installed: skipped"
	exit 77
fi
parent=${1:-${TMPDIR:-/tmp}}
mkdir -p "$parent"
tmp=$(mktemp -d "$parent/model-cache.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# A copy of the folder, with a model that verifies (tiny) or fails (tiny-bug) in a
# moment, as a run and as a mutant.
model=$tmp/model
mkdir "$model"
cp "$here"/check.sh "$here"/*.pml "$model"/
cat >"$model/tiny.pml" <<'EOF'
/* A model checked in a moment: BUG makes its assertion fail. */
byte x;
active proctype p()
{
	x = 1;
#ifdef BUG
	assert(x == 0)
#else
	assert(x == 1)
#endif
}
EOF
sed -i -e 's/^configs=($/&\n\t"tiny|--model=tiny.pml"\n\t"tiny-bug|--model=tiny.pml -DBUG"/' \
	-e 's/^mutants=($/&\n\t"tiny-bug|--model=tiny.pml -DBUG"\n\t"tiny|--model=tiny.pml"/' "$model/check.sh"
grep -q '"tiny|' "$model/check.sh" || {
	echo "FAIL: could not add the tiny runs to check.sh's configs and mutants"
	exit 1
}

export XMEM_CACHE_DIR=$tmp/cache
unset XMEM_MODEL_CACHE
failures=0

# check WHAT EXPECTED_RC PATTERN... -- CHECK_ARGS... : runs the copy's check.sh with
# CHECK_ARGS; its exit status must be EXPECTED_RC and its output match every PATTERN.
check() {
	local what=$1 expected=$2 rc=0 p
	shift 2
	local patterns=()
	while [ "$1" != -- ]; do
		patterns+=("$1")
		shift
	done
	shift
	bash "$model/check.sh" "$@" "$tmp/work" >"$tmp/out" 2>&1 || rc=$?
	local ok=yes
	[ "$rc" = "$expected" ] || ok=no
	for p in "${patterns[@]}"; do
		grep -qE -- "$p" "$tmp/out" || ok=no
	done
	if [ $ok = yes ]; then
		echo "ok: $what"
	else
		echo "FAIL: $what (exit $rc, expected $expected; wanted: ${patterns[*]})"
		sed 's/^/    /' "$tmp/out"
		failures=$((failures + 1))
	fi
}

ran() { echo "^model cache $XMEM_CACHE_DIR/model: 0 reused, 1 ran$"; }
reused() { echo "^model cache $XMEM_CACHE_DIR/model: 1 reused, 0 ran$"; }

export XMEM_MODEL_ONLY='^tiny$'
check "a first run runs and stores" 0 "^tiny: states=[0-9]+ .* PASS$" "$(ran)" --
[ "$(find "$tmp/cache/model" -type f | wc -l)" = 1 ] || {
	echo "FAIL: the cache holds $(find "$tmp/cache/model" -type f | wc -l) files, not 1"
	failures=$((failures + 1))
}
check "the second run is reused" 0 "^tiny: states=[0-9]+ .* PASS \(cached [0-9-]+ [0-9:]+ UTC, key [0-9a-f]{12}\)$" "$(reused)" --
sed -i '2s/$/ (an edit elsewhere in check.sh)/' "$model/check.sh"
check "an edit of check.sh outside what a run depends on keeps it" 0 "$(reused)" --
echo '/* a comment */' >>"$model/xmem.pml"
check "a changed model file reruns (any .pml: it may be included)" 0 "^tiny: .* PASS$" "$(ran)" --
echo '/* a comment */' >>"$model/tiny.pml"
check "a changed model reruns" 0 "$(ran)" --
check "and is then reused" 0 "$(reused)" --
sed -i 's/^\t"tiny|--model=tiny.pml"$/\t"tiny|--model=tiny.pml -DUNUSED_DEFINE"/' "$model/check.sh"
check "a changed define reruns" 0 "$(ran)" --
sed -i 's/^PAN_ARGS=(-m400000)$/PAN_ARGS=(-m300000)/' "$model/check.sh"
check "changed arguments of pan rerun" 0 "$(ran)" --
sed -i 's/^PAN_CFLAGS=(-O2 /PAN_CFLAGS=(-O1 /' "$model/check.sh"
check "changed flags of pan rerun" 0 "$(ran)" --
sed -i 's/errors: 0/errors: 0\\b/' "$model/check.sh"
check "a changed verdict reruns" 0 "$(ran)" --
XMEM_MODEL_CACHE=0 check "XMEM_MODEL_CACHE=0 reruns" 0 "^tiny: .* PASS$" "not read \(XMEM_MODEL_CACHE=0\), 1 ran$" --
for entry in "$tmp"/cache/model/*; do
	sed -i '/^--- pan$/q' "$entry"
done
check "a stored output that no longer passes is not reused" 0 "$(ran)" --
check "the run stored again is reused" 0 "$(reused)" --
check "a run under another mode is not the same run" 1 "^tiny: .* MISSED" "$(ran)" -- --mutants

export XMEM_MODEL_ONLY='^tiny-bug$'
check "a failing run fails" 1 "^tiny-bug: .* FAIL" "$(ran)" --
check "and is not stored" 1 "^tiny-bug: .* FAIL" "$(ran)" --
check "a caught mutant is stored" 0 "^tiny-bug: .* CAUGHT: pan:1: assertion violated" "$(ran)" -- --mutants
check "and reused" 0 "^tiny-bug: .* CAUGHT: pan:1: assertion violated .*\(cached " "$(reused)" -- --mutants

XMEM_CACHE_DIR=/proc/no-such-dir XDG_CACHE_HOME=$tmp/user-cache \
	check "an unwritable XMEM_CACHE_DIR falls back to XDG_CACHE_HOME" 0 "^model cache $tmp/user-cache/xmem/model: 0 reused, 1 ran$" -- --mutants

if [ $failures != 0 ]; then
	echo "$failures check(s) failed"
	exit 1
fi
echo "all checks passed"
