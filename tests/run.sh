#!/usr/bin/env bash
# tests/run.sh - the README's test command: installs missing Debian packages,
# configures, builds and runs the whole suite under meson test.
#   BUILD=dir        build directory (default: build)
#   MESON_ARGS="..." extra options for `meson setup` (or `meson configure`, on a build
#                    directory configured before; e.g. sanitizers)
#   TEST_ARGS="..."  extra options for `meson test` (e.g. --no-suite python)
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/bootstrap.sh

xmem_install_packages "${XMEM_PACKAGES[@]}"

build=${BUILD:-build}
args=(-Dtests=enabled)
# CI treats warnings as errors; so does anyone who sets CI=true.
[ "${CI:-}" = "true" ] && args+=(-Dwerror=true)
# The CUDA pools need only the toolkit's cuda.h, and the elements' CUDA memory
# GStreamer's CUDA library (no GPU: their tests run against tests/cudasim). CI has
# both, so there a missing one is an error, not a skip.
# (GST_CUDA=auto where a run leaves GStreamer out.)
[ "${CI:-}" = "true" ] && args+=(-Dcuda=enabled "-Dgst-cuda=${GST_CUDA:-enabled}")
# shellcheck disable=SC2206
args+=(${MESON_ARGS:-})
xmem_configure "$build" "${args[@]}"
meson compile -C "$build"
# shellcheck disable=SC2206
test_args=(${TEST_ARGS:-})
meson test -C "$build" --print-errorlogs --num-processes "${XMEM_TEST_JOBS:-2}" "${test_args[@]}"
