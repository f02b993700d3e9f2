#!/bin/sh
# Open MPI's remote launcher (plm_rsh_agent) for the two-"host" test (tests/train/test_two_hosts.py):
# called as `netns_agent.sh HOST COMMAND...` where ssh would be, it runs COMMAND (a shell command
# line, as ssh would hand it to the remote shell) inside HOST's network namespace, from
# MOECORE_NETNS_HOSTS="addr=namespace,addr=namespace".
host=$1
shift
for pair in $(echo "${MOECORE_NETNS_HOSTS:-}" | tr ',' ' '); do
  if [ "${pair%%=*}" = "$host" ]; then
    exec ip netns exec "${pair#*=}" /bin/sh -c "$*"
  fi
done
echo "netns_agent.sh: no namespace for host '$host' in MOECORE_NETNS_HOSTS='${MOECORE_NETNS_HOSTS:-}'" >&2
exit 255
