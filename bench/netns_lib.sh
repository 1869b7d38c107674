# netns_lib.sh -- sourced by bench/run_zero2.sh and bench/run_zero3.sh: a
# private network namespace whose loopback is rate-limited to one shared
# 1 Gbit/s link (tc tbf), with Open MPI forced onto TCP in it: ranks as if
# on separate hosts.  Needs root and iproute2.
NS=zdpnet$$

# netns_up: makes $NS; 1 (after saying why) without root or tc.
netns_up() {
  if [ "$(id -u)" -ne 0 ] || ! command -v tc >/dev/null; then
    echo "skipping the rate-limited TCP run: needs root and iproute2 (tc)"
    return 1
  fi
  ip netns add "$NS"
  ip netns exec "$NS" ip link set lo up
  ip netns exec "$NS" ip link set lo mtu 9000
  # The burst must exceed the MTU or packets are dropped.
  ip netns exec "$NS" tc qdisc replace dev lo root tbf rate 1gbit burst 2mb latency 200ms
}

# netns_down: removes $NS (nothing when there is none): for the EXIT trap too.
netns_down() { ip netns del "$NS" 2>/dev/null || true; }

# netns_mpirun MPIRUN_ARGS...: mpirun inside $NS over TCP on its loopback,
# under a timeout of NETNS_TIMEOUT seconds (1200).
netns_mpirun() {
  ip netns exec "$NS" env OMPI_MCA_btl=tcp,self timeout "${NETNS_TIMEOUT:-1200}" mpirun \
    --mca btl tcp,self --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo "$@"
}
