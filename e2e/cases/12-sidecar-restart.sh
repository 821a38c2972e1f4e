# Killing denvd mid-command and starting it again loses no environment: it is still
# there, still addressable, with its data, and the interrupted command's deployment ends.
# Network rules lost meanwhile (as after a reboot) are back once denvd is connected.
denv project create restart >/dev/null
printf 'services:\n  box:\n    image: busybox:1.36\n    command: ["sleep","1000000"]\n    volumes: ["w:/work"]\nvolumes: { w: {} }\n' > c.yaml
denv deploy --project restart -f c.yaml >/dev/null
ENV=$(env_id restart alpha)
exec_out $ENV box sh -c 'echo kept > /work/f' >/dev/null
# A command in flight when the sidecar dies.
denv exec --service box $ENV -- sleep 4 >/dev/null 2>&1 &
EXEC_PID=$!
sleep 1
kill -9 "$(cat "$STACK_DIR/denvd.pid")"
# With denvd down, an outside lookup from the box is still refused at once (the refuser
# on the gateway is a process of its own), not left to time out.
BOXC=$(docker ps --filter "label=denv.env=$ENV" --filter "label=com.docker.compose.service=box" --format '{{.Names}}' | head -1)
[ -n "$BOXC" ] || die "no box container for $ENV"
T0=$(date +%s%N)
X=$(docker exec "$BOXC" nslookup denv-e2e-down.example.com 2>&1 || true)
MS=$(( ($(date +%s%N) - T0) / 1000000 ))
assert_contains "$X" "REFUSED" "outside lookup with denvd down"
[ "$MS" -lt 2500 ] || die "the outside lookup took $MS ms with denvd down"
# The environment's rules vanish while denvd is down.
NET="$(printf '%s' "$ENV" | tr 'A-Z' 'a-z')_default"
BR=$(docker network inspect -f '{{index .Options "com.docker.network.bridge.name"}}' "$NET")
# denvd's own rules: the owner tag is on the network's label.
O=$(docker network inspect -f '{{index .Labels "denv.owner"}}' "$NET")
if [ "${DENV_PACKET_FILTER:-}" = iptables ]; then
  H=${BR#dv}
  for b in iptables ip6tables; do
    $b -w -D "D$O-FWD" -i "$BR" -j "D$O-$H-O"; $b -w -D "D$O-IN" -i "$BR" -j "D$O-$H-I"
    $b -w -F "D$O-$H-O"; $b -w -X "D$O-$H-O"; $b -w -F "D$O-$H-I"; $b -w -X "D$O-$H-I"
  done
  has_rules() { iptables -w -S "D$O-$H-O" >/dev/null 2>&1; }
else
  T="denv_$O"
  printf 'delete element inet %s env_fwd { "%s" }\ndelete element inet %s env_in { "%s" }\ndelete chain inet %s env_%s_out\ndelete chain inet %s env_%s_in\n' "$T" "$BR" "$T" "$BR" "$T" "$BR" "$T" "$BR" | nft -f -
  has_rules() { nft list chain inet "$T" "env_${BR}_out" >/dev/null 2>&1; }
fi
has_rules && die "rules of $BR still there"
(exec denvd run --state "$STACK_DIR/host.json" >>"$STACK_DIR/denvd.log" 2>&1) &
echo $! > "$STACK_DIR/denvd.pid"
for _ in $(seq 1 100); do
  [[ "$(denv host list)" == *'"connected": true'* ]] && break
  sleep 0.2
done
assert_contains "$(denv host list)" '"connected": true' "host after restart"
has_rules || die "the rules of $BR are not back after the restart"
# A listener on the host: without the rules the box would reach it on the gateway.
HOSTPORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')
python3 -m http.server "$HOSTPORT" --bind 0.0.0.0 >/dev/null 2>&1 &
HOSTSRV=$!
trap 'kill $HOSTSRV 2>/dev/null || true' EXIT
for _ in $(seq 1 50); do curl -fsS -o /dev/null "http://127.0.0.1:$HOSTPORT/" && break; sleep 0.1; done
GW=$(docker network inspect -f '{{(index .IPAM.Config 0).Gateway}}' "$(printf '%s' "$ENV" | tr 'A-Z' 'a-z')_default")
R=$(denv exec --service box $ENV -- wget -q -T 3 -O /dev/null "http://$GW:$HOSTPORT/" 2>&1 || true)
assert_eq "$(printf '%s' "$R" | json_get "d['exit_code'] != 0 and 'refused' in d['stderr']")" True "the host refused after the restart: $R"
# The interrupted exec had no result: the control plane sends it again on reconnect
# and the caller gets its answer.
wait $EXEC_PID || die "the exec interrupted by the sidecar's death did not complete"
assert_eq "$(exec_out $ENV box cat /work/f)" kept "data after the sidecar restart"
denv snapshot $ENV >/dev/null
denv fork --name after-restart $ENV >/dev/null
F=$(env_id restart after-restart)
assert_eq "$(exec_out $F box cat /work/f)" kept "fork after the sidecar restart"
denv env destroy $F >/dev/null; denv env destroy $ENV >/dev/null
wait_destroyed $F; wait_destroyed $ENV
