# pipelines/common.sh - sourced by the scripts in pipelines/ from the repository root:
# builds what they run, and reads the overrides the test suite runs their lines with.
#
#   XMEM_NUM_BUFFERS=N   the source stops after N buffers (num-buffers=N)
#   XMEM_SINK="..."      replaces the final display sink (e.g. "fakesink silent=false")
#   XMEM_GST_ARGS="..."  extra gst-launch-1.0 options (e.g. -v)
#   XMEM_BUILD_DIR=dir   the build directory (default: build)
#   XMEM_SKIP_SETUP=1    use that build as it is: no package install, no configure or compile

# shellcheck shell=bash
. tools/bootstrap.sh

XMEM_BUILD_DIR=${XMEM_BUILD_DIR:-build}

# xmem_pipelines_setup [PACKAGE...]: installs what is missing of PACKAGEs (default:
# XMEM_PIPELINES_PACKAGES), configures and builds the plugin and xmem-inspect (unless
# XMEM_SKIP_SETUP is set), then points GStreamer at the plugin.
xmem_pipelines_setup() {
	if [ -z "${XMEM_SKIP_SETUP:-}" ]; then
		if [ $# -gt 0 ]; then
			xmem_install_packages "$@"
		else
			xmem_install_packages "${XMEM_PIPELINES_PACKAGES[@]}"
		fi
		# A build directory made here has no debug information: a third of the build's
		# time (on 2 cores, 62 s instead of 87 s without ccache), for code as fast. A
		# directory configured before is used as it is.
		local log setup=()
		[ -f "$XMEM_BUILD_DIR/build.ninja" ] || setup=(-Ddebug=false)
		if ! log=$({ xmem_configure "$XMEM_BUILD_DIR" "${setup[@]}" && meson compile -C "$XMEM_BUILD_DIR" gstxmem xmem-inspect; } 2>&1); then
			printf '%s\n' "$log" >&2
			echo "xmem: the build failed" >&2
			exit 1
		fi
	fi
	xmem_gst_env "$(realpath --relative-to="$PWD" "$XMEM_BUILD_DIR")"
	# shellcheck disable=SC2034 # for the scripts that source this file
	XMEM_INSPECT=$XMEM_BUILD_DIR/tools/xmem-inspect
}

# xmem_use_installed PACKAGE...: when this tree's version of xmem's packages is installed
# (gstreamer1.0-xmem, whose plugin GStreamer finds by itself, and xmem-tools), uses them
# instead of building: installs what is missing of PACKAGEs (what the caller runs besides
# xmem) and sets XMEM_INSPECT. Otherwise false, changing nothing; always false with
# XMEM_FROM_SOURCE or XMEM_SKIP_SETUP set, which mean this tree's build.
xmem_use_installed() {
	[ -z "${XMEM_FROM_SOURCE:-}${XMEM_SKIP_SETUP:-}" ] || return 1
	command -v dpkg-query >/dev/null || return 1
	local want status version found=0
	want=$(tools/debian-changelog.sh --version)
	while read -r status version; do
		[ "$status" = ii ] && [ "$version" = "$want" ] || return 1
		found=$((found + 1))
	done < <(dpkg-query -W -f='${db:Status-Abbrev} ${Version}\n' gstreamer1.0-xmem xmem-tools 2>/dev/null)
	[ $found -eq 2 ] || return 1
	echo "xmem: using the installed packages (gstreamer1.0-xmem and xmem-tools $want); XMEM_FROM_SOURCE=1 builds this tree instead" >&2
	xmem_install_packages "$@"
	# shellcheck disable=SC2034 # for the scripts that source this file
	XMEM_INSPECT=xmem-inspect
}

# Prints the launch line, then replaces the shell with gst-launch-1.0 -e running it,
# so that Ctrl-C reaches gst-launch and ends the stream with EOS.
xmem_launch() {
	local extra=()
	# shellcheck disable=SC2206 # options are words on purpose
	extra=(${XMEM_GST_ARGS:-})
	echo "+ gst-launch-1.0 -e ${extra[*]:+${extra[*]} }$*" >&2
	exec gst-launch-1.0 -e "${extra[@]}" "$@"
}

# xmem_choose_sink SCRIPT DISPLAY DISPLAY_SINK...: sets the array `sink` to XMEM_SINK's
# words, fakesink without DISPLAY, DISPLAY_SINK when there is a display, or fakesink
# with a message (naming SCRIPT) when there is none.
xmem_choose_sink() {
	local script=$1 display=$2
	shift 2
	if [ -n "${XMEM_SINK:-}" ]; then
		read -ra sink <<<"$XMEM_SINK"
	elif [ -z "$display" ]; then
		sink=(fakesink)
	elif [ -n "${DISPLAY:-}${WAYLAND_DISPLAY:-}" ]; then
		sink=("$@")
	else
		echo "$script: no display (\$DISPLAY and \$WAYLAND_DISPLAY are unset): frames go to fakesink" >&2
		sink=(fakesink)
	fi
}
