#!/bin/sh
# Entry point of the worker image: prepares cgroup v2 nesting, then runs the worker with the given flags.
#
# In a Kubernetes pod on cgroup v2 the container has its own cgroup namespace whose root is the pod's
# container cgroup, and this process lives in it. cgroup v2 allows no processes in a cgroup whose
# controllers are delegated to children ("no internal processes"), so runc could not enable memory, pids
# and cpu for the calls' cgroups beneath it. As docker's dind does, move every process of the root into a
# leaf cgroup "init" and delegate all controllers. Off with TOOLPOOL_CGROUP_NESTING=off; a no-op on
# cgroup v1, outside a cgroup namespace, or where /sys/fs/cgroup is read-only.
set -eu
if [ "${TOOLPOOL_CGROUP_NESTING:-on}" != off ] \
  && [ -f /sys/fs/cgroup/cgroup.controllers ] \
  && grep -qx '0::/' /proc/self/cgroup \
  && [ -w /sys/fs/cgroup/cgroup.subtree_control ]; then
  mkdir -p /sys/fs/cgroup/init
  # Move one process at a time; a process that exits meanwhile is not an error.
  xargs -rn1 < /sys/fs/cgroup/cgroup.procs > /sys/fs/cgroup/init/cgroup.procs 2>/dev/null || :
  sed -e 's/ / +/g' -e 's/^/+/' < /sys/fs/cgroup/cgroup.controllers > /sys/fs/cgroup/cgroup.subtree_control
fi
exec /usr/local/bin/worker "$@"
