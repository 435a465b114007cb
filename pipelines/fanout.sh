#!/usr/bin/env bash
# pipelines/fanout.sh [POOL] [N] - N consumers (default 3) of the xmem pool POOL (default
# cam0), each pipelines/consumer.sh in its own background process; Ctrl-C stops them all.
# Start a producer beside it: pipelines/producer.sh POOL, or decode-file.sh FILE POOL.
set -euo pipefail
cd "$(dirname "$0")/.."
. pipelines/common.sh
xmem_pipelines_setup

pool=${1:-cam0}
count=${2:-3}

fifos=$(mktemp -d)
trap 'rm -rf "$fifos"' EXIT
consumers=()
relays=()
# Ctrl-C reaches every process of the terminal's group by itself; a TERM sent to this
# script alone is passed on as the interrupt that makes gst-launch-1.0 -e send EOS.
trap 'echo "fanout.sh: interrupted, waiting for the consumers" >&2' INT
trap 'kill -INT "${consumers[@]}" 2>/dev/null || true' TERM

# Built once above, so the consumers skip the setup. Each line says whose it is.
for i in $(seq 1 "$count"); do
	mkfifo "$fifos/$i"
	sed -u "s/^/[consumer $i] /" <"$fifos/$i" &
	relays+=("$!")
	XMEM_SKIP_SETUP=1 pipelines/consumer.sh "$pool" >"$fifos/$i" 2>&1 &
	consumers+=("$!")
done

# wait returns early (above 128) when a trapped signal arrives: wait again then.
wait_for() {
	local rc
	while :; do
		wait "$1" && return 0
		rc=$?
		[ $rc -gt 128 ] && kill -0 "$1" 2>/dev/null && continue
		return $rc
	done
}

failed=0
for i in "${!consumers[@]}"; do
	if ! wait_for "${consumers[$i]}"; then
		echo "fanout.sh: consumer $((i + 1)) failed" >&2
		failed=1
	fi
done
for pid in "${relays[@]}"; do
	wait_for "$pid" || true
done
exit $failed
