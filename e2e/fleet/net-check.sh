#!/usr/bin/env bash
# Checks e2e/lib/fleet-net.sh for real, on this machine (root, Docker, busybox:1.36 in the
# main engine): three hosts come up, each engine runs containers with memory and pids
# caps, traffic crosses the link (a container of host 1 fetches from a server in host 2's
# namespace; the root namespace and host 1 reach each other), nftables are per host, an
# engine stopped (and killed) leaves nothing running and its containers restartable, a
# cut link makes a TCP connection hang (not reset) until it is restored, link-slow slows
# a 50 MB transfer to the rate and adds its delay (without throttling a bulk transfer
# when both ends are slowed), and `down` leaves nothing of a host.
# One PASS/FAIL line per check, then `fleet-net: N passed, N failed`; exit 1 on a failure.
#
#   e2e/fleet/net-check.sh        # hosts nc1..nc3 at 10.231.0.41-43 (IDX 31-33)
#
# Only its own hosts are touched; the bridge is removed at the end only when no other
# host is up (another run's fleet is left alone).
set -uo pipefail
E2E="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=../lib/fleet-net.sh
source "$E2E/lib/fleet-net.sh"

H=(nc1 nc2 nc3)
IDX=(31 32 33)
WORK=$(mktemp -d /tmp/denv-fleet-net-check.XXXXXX)
PASS=0 FAIL=0
T0=$(date +%s)
ok() { PASS=$((PASS + 1)); echo "PASS $*"; }
bad() { FAIL=$((FAIL + 1)); echo "FAIL $*"; }
check() { local what=$1; shift; if "$@"; then ok "$what"; else bad "$what"; fi; }
dk() { local n=$1; shift; docker -H "unix://$(fleet_sock "$n")" "$@"; }
ms() { echo $((($(date +%s%N) - $1) / 1000000)); }
PIDS=()
cleanup() {
    local p n
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    for n in "${H[@]}"; do fleet_down "$n" >/dev/null 2>&1; done
    [ -n "$(fleet_hosts)" ] || fleet_net_down >/dev/null 2>&1
    rm -rf "$WORK"
}
trap cleanup EXIT
[ "$(id -u)" = 0 ] || { echo "FAIL fleet-net: run as root"; exit 1; }
docker image inspect busybox:1.36 >/dev/null 2>&1 || { echo "FAIL fleet-net: busybox:1.36 is not in the main engine (e2e/setup-host.sh)"; exit 1; }

# --- 1. three hosts, caps, traffic over the link.
for i in 0 1 2; do
    t=$(date +%s%N)
    fleet_up "${H[$i]}" "${IDX[$i]}" --images busybox:1.36 >/dev/null || { bad "up ${H[$i]}"; exit 1; }
    echo "  ${H[$i]} up with busybox in $(ms "$t") ms"
done
caps_ok() {
    local n out
    for n in "${H[@]}"; do
        out=$(dk "$n" run --rm --memory 64m --pids-limit 64 busybox:1.36 sh -c \
            'cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max; cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max') || return 1
        [ "$(echo $out)" = "67108864 64" ] || { echo "  $n: limits seen inside: $(echo $out)"; return 1; }
    done
    # The memory cap is enforced: 200 MB in a 64 MiB container is OOM-killed (137).
    dk "${H[0]}" run --rm --memory 64m busybox:1.36 sh -c 'x=$(head -c 200000000 /dev/zero | tr "\0" a); echo ${#x}' >/dev/null 2>&1
    [ $? = 137 ] || { echo "  the 64 MiB container was not OOM-killed"; return 1; }
}
check "every engine runs containers with --memory 64m --pids-limit 64 (enforced)" caps_ok

mkdir -p "$WORK/www" && echo "served-by-${H[1]}" >"$WORK/www/index.html"
A1=$(fleet_ip "${H[0]}") A2=$(fleet_ip "${H[1]}")
(cd "$WORK/www" && fleet_exec "${H[1]}" python3 -m http.server 8000 --bind "$A2" >"$WORK/h2.log" 2>&1) &
PIDS+=($!)
(cd "$WORK/www" && fleet_exec "${H[0]}" python3 -m http.server 8001 --bind "$A1" >"$WORK/h1.log" 2>&1) &
PIDS+=($!)
(cd "$WORK/www" && exec python3 -m http.server 8002 --bind "$FLEET_GW" >"$WORK/root.log" 2>&1) &
PIDS+=($!)
for _ in $(seq 1 50); do curl -fsS -m 1 -o /dev/null "http://$A1:8001/" 2>/dev/null && break; sleep 0.1; done
check "a container of ${H[0]} fetches from a server in ${H[1]}'s namespace ($A2)" \
    test "$(dk "${H[0]}" run --rm busybox:1.36 wget -qO- -T 5 "http://$A2:8000/" 2>&1)" = "served-by-${H[1]}"
check "the root namespace reaches ${H[0]} ($A1)" test "$(curl -fsS -m 5 "http://$A1:8001/")" = "served-by-${H[1]}"
check "${H[0]} reaches the root namespace ($FLEET_GW)" test "$(fleet_exec "${H[0]}" curl -fsS -m 5 "http://$FLEET_GW:8002/")" = "served-by-${H[1]}"

# --- 2. nftables per host.
nft_apart() {
    fleet_exec "${H[0]}" nft add table inet denv_fleet_check || return 1
    local here there root
    here=$(fleet_exec "${H[0]}" nft list tables | grep -c denv_fleet_check)
    there=$(fleet_exec "${H[1]}" nft list tables | grep -c denv_fleet_check)
    root=$(nft list tables | grep -c denv_fleet_check)
    fleet_exec "${H[0]}" nft delete table inet denv_fleet_check
    [ "$here/$there/$root" = "1/0/0" ] || { echo "  table seen in ${H[0]}/${H[1]}/root: $here/$there/$root"; return 1; }
}
check "an nftables table made in one host is not in another or in the root namespace" nft_apart

# --- 4a. engine faults.
N=${H[2]}
dk "$N" run -d --name keep --restart unless-stopped busybox:1.36 sleep 100000 >/dev/null
dk "$N" run -d --name plain busybox:1.36 sleep 100000 >/dev/null
engine_gone() { # nothing of the engine runs: no process in its cgroups, no shim
    [ -z "$(_fleet_cg_pids "$N")" ] && ! pgrep -f "containerd-shim.*$FLEET_RUN/$N/" >/dev/null
}
stop_start() { # stop_start [--kill]
    local t
    t=$(date +%s%N)
    fleet_engine_stop "$N" "$@" 2>/dev/null || return 1
    echo "  engine-stop $* took $(ms "$t") ms"
    engine_gone || { echo "  still running: $(_fleet_cg_pids "$N" | tr '\n' ' ')"; return 1; }
    t=$(date +%s%N)
    fleet_engine_start "$N" || return 1
    echo "  engine-start took $(ms "$t") ms"
    [ "$(dk "$N" inspect -f '{{.State.Running}}' keep)" = true ] || { echo "  'keep' (restart unless-stopped) is not running"; return 1; }
    [ "$(dk "$N" inspect -f '{{.State.Running}}' plain)" = false ] || { echo "  'plain' is running"; return 1; }
    dk "$N" start plain >/dev/null && [ "$(dk "$N" inspect -f '{{.State.Running}}' plain)" = true ]
}
check "engine-stop leaves nothing running; engine-start brings the data back (restart policy, docker start)" stop_start
check "engine-stop --kill (a crash) leaves nothing running; the containers come back the same way" stop_start --kill

# --- 4b. link cut: an established TCP connection hangs, then goes on.
cat >"$WORK/tick.py" <<'EOF'
import socket, sys, time
if sys.argv[1] == "server":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[2], 18099)); s.listen(1); c, _ = s.accept(); i = 0
    while True:
        c.sendall(b"%d\n" % i); i += 1
        if not c.recv(16): break
        time.sleep(0.2)
else:
    c = socket.create_connection((sys.argv[2], 18099), timeout=5); c.settimeout(None)
    t0 = last = time.time(); gap = 0
    try:
        while time.time() - t0 < float(sys.argv[3]):
            if not c.recv(16): print("reset-or-closed"); sys.exit(1)
            now = time.time(); gap = max(gap, now - last); last = now; c.sendall(b"ok")
    except OSError as e:
        print("error", e); sys.exit(1)
    print("maxgap %.1f" % gap)
EOF
(exec python3 "$WORK/tick.py" server "$FLEET_GW" >"$WORK/tick-server.log" 2>&1) &
PIDS+=($!)
sleep 0.5
fleet_exec "${H[0]}" python3 "$WORK/tick.py" client "$FLEET_GW" 20 >"$WORK/tick.log" 2>&1 &
TICK=$!
sleep 2
fleet_link_cut "${H[0]}" 2>/dev/null
sleep 6
fleet_link_restore "${H[0]}" 2>/dev/null
wait "$TICK"
tick_ok() {
    local g
    g=$(sed -n 's/^maxgap //p' "$WORK/tick.log")
    echo "  longest silence: ${g:-?} s (link cut for 6 s); client said: $(cat "$WORK/tick.log")"
    [ -n "$g" ] && awk -v g="$g" 'BEGIN { exit !(g >= 5.5) }'
}
check "link-cut: a TCP connection from ${H[0]} to $FLEET_GW hangs (no reset) and goes on after link-restore" tick_ok

# --- 4c. link slow.
head -c 50000000 /dev/urandom >"$WORK/www/50m.bin"
fetch() { fleet_exec "${H[0]}" curl -fsS -o /dev/null -w "$1" "http://$A2:8000/50m.bin"; }
slow_ok() {
    local base slow
    base=$(fetch '%{time_total}')
    fleet_link_slow "${H[0]}" 0 200 2>/dev/null || return 1
    slow=$(fetch '%{time_total}')
    fleet_link_clear "${H[0]}" 2>/dev/null
    echo "  50 MB from ${H[1]} to ${H[0]}: ${base} s, at 200 Mbit/s ${slow} s (2.0 s at the rate)"
    awk -v s="$slow" -v b="$base" 'BEGIN { exit !(s >= 1.6 && s > 4 * b) }'
}
check "link-slow 0 200: a 50 MB transfer takes about 2 s" slow_ok
delay_ok() {
    local c
    fleet_link_slow "${H[0]}" 25 200 2>/dev/null || return 1
    c=$(fleet_exec "${H[0]}" curl -fsS -o /dev/null -w '%{time_connect}' "http://$FLEET_GW:8002/")
    fleet_link_clear "${H[0]}" 2>/dev/null
    echo "  TCP connect from ${H[0]} to $FLEET_GW with 25 ms each way: $c s"
    awk -v c="$c" 'BEGIN { exit !(c >= 0.045 && c < 0.5) }'
}
check "link-slow 25 200: a round trip takes 50 ms more" delay_ok
bulk_delay_ok() { # delay on both ends must not throttle a bulk transfer below the rate
    local t
    fleet_link_slow "${H[0]}" 5 200 2>/dev/null && fleet_link_slow "${H[1]}" 5 200 2>/dev/null || return 1
    t=$(fetch '%{time_total}')
    fleet_link_clear "${H[0]}" 2>/dev/null; fleet_link_clear "${H[1]}" 2>/dev/null
    echo "  50 MB from ${H[1]} to ${H[0]}, both links 5 ms and 200 Mbit/s: $t s"
    awk -v t="$t" 'BEGIN { exit !(t >= 1.6 && t < 4) }'
}
check "link-slow 5 200 on both hosts: a 50 MB transfer still runs at the rate" bulk_delay_ok

# --- 5. down leaves nothing.
for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
PIDS=()
for n in "${H[@]}"; do fleet_down "$n" 2>/dev/null; done
nothing_left() {
    local n left=""
    for n in "${H[@]}"; do
        [ -e "/run/netns/$(fleet_ns "$n")" ] && left+=" netns:$n"
        ip link show "$(_fleet_veth "$n")" >/dev/null 2>&1 && left+=" veth:$n"
        pgrep -f "dockerd.*$FLEET_RUN/$n/" >/dev/null && left+=" dockerd:$n"
        pgrep -f "containerd.*$FLEET_RUN/$n/" >/dev/null && left+=" containerd-or-shim:$n"
        findmnt -rn -o TARGET | grep -qE "^($FLEET_RUN|$FLEET_LIB)/$n/" && left+=" mounts:$n"
        [ -e "$FLEET_RUN/$n" ] || [ -e "$FLEET_LIB/$n" ] && left+=" dirs:$n"
        [ -n "$(_fleet_cg_all "$n")" ] && left+=" cgroups:$n"
    done
    if [ -z "$(fleet_hosts)" ]; then
        local why
        if why=$(fleet_net_down 2>&1); then
            ip link show "$FLEET_BRIDGE" >/dev/null 2>&1 && left+=" bridge"
            iptables -S 2>/dev/null | grep -q DENV-FLEET && left+=" iptables"
        elif [[ "$why" == *"sockets on $FLEET_GW"* ]]; then
            echo "  the bridge stays: another process uses $FLEET_GW (${why#*kept: })"
        else
            left+=" bridge ($why)"
        fi
    else
        echo "  other hosts are up ($(fleet_hosts | tr '\n' ' ')): the bridge stays"
    fi
    [ -z "$left" ] || { echo "  left:$left"; return 1; }
}
check "down leaves no netns, veth, dockerd, containerd, shim, mount, directory or cgroup (and no bridge when no host is left)" nothing_left

echo "fleet-net: $PASS passed, $FAIL failed ($(( $(date +%s) - T0 )) s)"
[ "$FAIL" = 0 ]
