# shellcheck shell=bash
# One builder per cache entry. Source it, then call
#
#   cache_lock NAME
#
# before looking at the cache: it takes an exclusive flock on
# $cache/.lock-NAME (creating $cache) and holds it until the script exits,
# so a second run of the same script (another suite, a parallel checkout)
# waits for the first and then finds the cache built instead of building
# into the same directory at the same time.
cache_lock() {
	local name=$1
	mkdir -p "$cache"
	exec {cache_lock_fd}>"$cache/.lock-$name"
	if ! flock -n "$cache_lock_fd"; then
		echo "$(basename "${BASH_SOURCE[1]}"): waiting for another build of $name in $cache" >&2
		flock "$cache_lock_fd"
	fi
}
