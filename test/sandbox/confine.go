package sandbox

// Confine is the shell script, run with /bin/sh -c in a mount namespace of
// its own (unshare -m --propagation private) inside the node's network
// namespace, that starts a command ("$@") the way the DaemonSet's
// container runs the agent: the root filesystem read-only, /run a writable
// tmpfs (what a pod mounts for the xtables lock), /proc/sys read-only
// (runc's default for a container that is not privileged) with
// /run/host/proc/sys/net a writable bind of /proc/sys/net (the DaemonSet's
// hostPath volume, used with --sysctl-dir /run/host/proc/sys), and only
// the capabilities in $CAPS as the bounding set (as root, the command then
// gets exactly those as permitted and effective, as in a container).
// setpriv is util-linux's by full path: busybox's applet (the IPVS VM's
// sh prefers its applets) has no --bounding-set.
const Confine = `set -e
mount -o remount,bind,ro /
mount -t tmpfs -o size=1m,mode=0755 tmpfs /run
mkdir -p /run/host/proc/sys/net
mount --bind /proc/sys/net /run/host/proc/sys/net
mount --bind /proc/sys /proc/sys
mount -o remount,bind,ro /proc/sys
exec /usr/bin/setpriv --inh-caps=-all --bounding-set="$CAPS" "$@"`
