#!/usr/bin/env bash
# tools/check-style.sh - the code checks CI keeps: clang-format (.clang-format) on every
# C/C++ file in git, and clang-tidy (.clang-tidy, every check kept is an error) on the
# sources of lib/, gst/, tools/, examples/ and bench/ that the build compiles.
#   tools/check-style.sh BUILD_DIR   a configured meson build dir (its compile_commands.json)
#   XMEM_TIDY_JOBS=n                 parallel clang-tidy processes (default: nproc)
#   XMEM_TIDY_DIRS="lib gst"         the folders clang-tidy looks at (default: lib gst tools examples bench)
# Exit status: 0 clean, 1 a file needs clang-format or clang-tidy found something, 2 misuse.
# clang-format's output differs between releases: CI uses Debian 12's (14).
set -euo pipefail

if [ $# -ne 1 ]; then
	echo "usage: $0 BUILD_DIR" >&2
	exit 2
fi
build=$(cd "$1" && pwd) || exit 2
cd "$(dirname "$0")/.."
if [ ! -f "$build/compile_commands.json" ]; then
	echo "$0: $build has no compile_commands.json: run meson setup first" >&2
	exit 2
fi
for tool in clang-format clang-tidy run-clang-tidy; do
	if ! command -v "$tool" >/dev/null; then
		echo "$0: $tool is missing (Debian: apt-get install clang-format clang-tidy)" >&2
		exit 2
	fi
done

status=0
start=$SECONDS

# 1. Formatting. Tracked files and new ones not yet added (CI runs on a clean clone, where
# the two are the same); a file deleted from the work tree is skipped.
unformatted=()
while IFS= read -r -d '' file; do
	[ -f "$file" ] || continue
	if ! clang-format --dry-run --Werror "$file" >/dev/null 2>&1; then
		unformatted+=("$file")
	fi
done < <(git ls-files -z --cached --others --exclude-standard -- '*.c' '*.h' '*.cpp' '*.hpp' | sort -zu)
if [ ${#unformatted[@]} -ne 0 ]; then
	echo "check-style: not formatted by .clang-format (fix: clang-format -i FILE...):"
	printf '  %s\n' "${unformatted[@]}"
	status=1
else
	echo "check-style: clang-format: all files formatted"
fi

# 2. clang-tidy on the sources the build compiles under the chosen folders. The file list
# comes from compile_commands.json, spelled as run-clang-tidy spells it, and is handed to it
# as an exact regex: a folder name alone would also match tests/gst/ and the like.
read -r -a dirs <<<"${XMEM_TIDY_DIRS:-lib gst tools examples bench}"
regex=$(python3 - "$build" "$(pwd -P)" "${dirs[@]}" <<'EOF'
import json, os, re, sys
build, root, dirs = sys.argv[1], sys.argv[2], sys.argv[3:]
with open(os.path.join(build, "compile_commands.json")) as f:
	entries = json.load(f)
files = set()
for e in entries:
	name = e["file"]
	if not os.path.isabs(name):
		name = os.path.join(e["directory"], name)
	name = os.path.normpath(name)
	rel = os.path.relpath(os.path.realpath(name), root)
	if rel.split(os.sep)[0] in dirs and rel.endswith((".c", ".cpp")):
		files.add(name)
if files:
	print("^(" + "|".join(re.escape(f) for f in sorted(files)) + ")$")
EOF
)
if [ -z "$regex" ]; then
	echo "check-style: no sources of ${dirs[*]} in $build/compile_commands.json" >&2
	exit 2
fi
count=$(tr '|' '\n' <<<"$regex" | wc -l)
jobs=${XMEM_TIDY_JOBS:-$(nproc)}
echo "check-style: clang-tidy on $count sources of ${dirs[*]}, $jobs at a time"
log=$(mktemp)
trap 'rm -f "$log" "$log.raw"' EXIT
# -Wno-unknown-warning-option: the build's flags are GCC's.
tidy_status=0
run-clang-tidy -p "$build" -j"$jobs" -quiet -extra-arg=-Wno-unknown-warning-option "$regex" >"$log.raw" 2>&1 ||
	tidy_status=$?
# run-clang-tidy always asks for colours: take them out for the log and the grep below.
sed 's/\x1b\[[0-9;]*m//g' "$log.raw" >"$log"
# Keep what clang-tidy said about the code, not its command lines.
grep -v -e '^clang-tidy' -e '^Running clang-tidy' -e 'warnings\? generated\.$' -e '^$' "$log" || true
# WarningsAsErrors makes any kept check fail clang-tidy; the grep holds even if it is
# relaxed, or a diagnostic comes from a compile error.
if [ $tidy_status -ne 0 ] || grep -qE '(warning|error): .*\[[a-z0-9.,-]+\]$' "$log"; then
	echo "check-style: clang-tidy found problems (see above; .clang-tidy says what is checked)"
	status=1
else
	echo "check-style: clang-tidy: clean"
fi
echo "check-style: done in $((SECONDS - start)) s"
exit $status
