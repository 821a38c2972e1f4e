# Killing denvd mid-command and starting it again loses no environment: it is still
# there, still addressable, with its data, and the interrupted command's deployment ends.
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
(exec denvd run --state "$STACK_DIR/host.json" >>"$STACK_DIR/denvd.log" 2>&1) &
echo $! > "$STACK_DIR/denvd.pid"
for _ in $(seq 1 100); do
  denv host list | grep -q '"connected": true' && break
  sleep 0.2
done
assert_contains "$(denv host list)" '"connected": true' "host after restart"
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
