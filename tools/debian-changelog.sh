#!/bin/sh
# tools/debian-changelog.sh [--check | --version] - the packages' version comes from one
# place, meson.build's project version: this writes debian/changelog's entry for it
# (native format: the version as it is), or with --check fails, saying how to fix it,
# when debian/changelog names another version (debian/rules checks before it builds);
# --version prints the version (pipelines/demo.sh compares installed packages with it).
set -eu
cd "$(dirname "$0")/.."
version=$(sed -n "s/^ *version *: *'\([^']*\)'.*/\1/p" meson.build | head -n 1)
if [ -z "$version" ]; then
	echo "debian-changelog.sh: no version in meson.build's project()" >&2
	exit 2
fi
if [ "${1:-}" = "--version" ]; then
	echo "$version"
	exit 0
fi
have=$(sed -n '1s/^xmem (\([^)]*\)).*/\1/p' debian/changelog 2>/dev/null || true)
if [ "${1:-}" = "--check" ]; then
	if [ "$have" != "$version" ]; then
		echo "debian/changelog says ${have:-nothing}, meson.build says $version: run tools/debian-changelog.sh" >&2
		exit 1
	fi
	exit 0
fi
[ "$have" = "$version" ] && exit 0
date=$(date -R)
{
	printf 'xmem (%s) unstable; urgency=medium\n\n' "$version"
	printf '  * xmem %s, from meson.build.\n\n' "$version"
	printf ' -- xmem maintainers <maintainers@users.noreply.a-seed-6846b21e.example>  %s\n' "$date"
	if [ -f debian/changelog ]; then
		echo
		cat debian/changelog
	fi
} >debian/changelog.new
mv debian/changelog.new debian/changelog
echo "debian/changelog: $version"
