#!/usr/bin/env bash
# bench/fresh-demo.sh - the README's first command as a new user meets it: pipelines/demo.sh
# in a fresh Debian 12 minbase root (debootstrap; fewer packages than any real machine
# starts with), on a copy of the committed tree (git archive HEAD), timed from the first
# package installed to the demo's last line. Prints the time and the packages it
# installed. Needs root (or sudo) for debootstrap and the mounts, and the network for
# the archive.
#   XMEM_FRESH_ROOT=dir     the pristine root, made once and kept
#                           (default /var/cache/xmem/debian12-minbase); each run copies it
#   XMEM_DEBIAN_MIRROR=url  the archive (default http://deb.debian.org/debian)
#   DEMO_FRAMES=N           frames the demo sends (default: the demo's own)
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
	exec sudo --preserve-env=XMEM_FRESH_ROOT,XMEM_DEBIAN_MIRROR,DEMO_FRAMES "$0" "$@"
fi

. tools/bootstrap.sh

pristine=${XMEM_FRESH_ROOT:-/var/cache/xmem/debian12-minbase}

xmem_install_packages debootstrap git
xmem_debootstrap bookworm "$pristine"

root=$(mktemp -d /var/tmp/xmem-fresh-demo.XXXXXX)
trap 'rm -rf "$root"' EXIT
cp -a "$pristine/." "$root/"
mkdir "$root/xmem"
git archive HEAD | tar -x -C "$root/xmem"

# What runs inside: the demo, timed, and the packages it added.
cat >"$root/fresh-demo-inner.sh" <<'INNER'
#!/bin/bash
set -euo pipefail
packages() { dpkg-query -W -f='${Package}\n' | sort; }
packages >/tmp/before
start=$(date +%s.%N)
/xmem/pipelines/demo.sh
end=$(date +%s.%N)
packages >/tmp/after
added=$(comm -13 /tmp/before /tmp/after | wc -l)
echo
awk -v s="$start" -v e="$end" -v n="$added" 'BEGIN {
	printf "fresh-demo: pipelines/demo.sh took %.0f s on a fresh Debian 12 minbase root; it installed %d packages\n", e - s, n
}'
INNER
chmod +x "$root/fresh-demo-inner.sh"

# As root in the root (no sudo there), in a mount namespace of its own.
xmem_in_root "$root" -- /usr/bin/env ${DEMO_FRAMES:+DEMO_FRAMES=$DEMO_FRAMES} /fresh-demo-inner.sh
