#!/usr/bin/env bash
# pipelines/display.sh [POOL] - shows the frames of the xmem pool POOL (default cam0) in
# a window (autovideosink); without a display it says so and uses fakesink instead.
exec "$(dirname "$0")/consumer.sh" --display "$@"
