# shellcheck shell=bash
# The arguments every cache-building script takes. Source it, then call
#
#   cache_args <last line of the header comment> "$@"
#
# --force sets force=true (rebuild what is cached); -h/--help prints the
# script's header comment (lines 2 to <last>) and exits; anything else is
# an error (exit 2).
cache_args() {
	local last=$1 name
	name=$(basename "${BASH_SOURCE[1]}")
	shift
	force=false
	for arg in "$@"; do
		case $arg in
		--force) force=true ;;
		-h | --help)
			sed -n "2,${last}p" "${BASH_SOURCE[1]}" | sed 's/^# \{0,1\}//'
			exit 0
			;;
		*)
			echo "$name: unknown argument $arg (try --help)" >&2
			exit 2
			;;
		esac
	done
}
