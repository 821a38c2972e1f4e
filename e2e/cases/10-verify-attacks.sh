# The verify attacks score 0 with source refused and the grader never runs.
denv project create attacks >/dev/null
cat "$E2E/fixtures/quickstart.compose.yaml" > compose.yaml
denv deploy --project attacks -f compose.yaml
ENV=$(env_id attacks alpha)
attack() { # <setup script> <expected reason>
  exec_out $ENV box sh -c "rm -rf /home/agent/answer.txt; $1" >/dev/null
  local out; out=$(denv verify --resume $ENV); echo "$out"
  assert_contains "$out" "reward: 0" "$2"
  assert_contains "$out" "source: refused" "$2"
  assert_contains "$out" "$2" "$2"
}
attack 'ln -s /etc/passwd /home/agent/answer.txt' 'home/agent/answer.txt: symlink'
attack 'mkfifo /home/agent/answer.txt' 'home/agent/answer.txt: fifo'
attack 'echo 42 > /home/agent/real; ln /home/agent/real /home/agent/answer.txt' 'home/agent/answer.txt: hard link'
attack 'mkdir -p /home/agent/answer.txt; head -c 270000000 /dev/zero > /home/agent/answer.txt/big' 'home/agent/answer.txt: submission larger than 256 MiB'
exec_out $ENV box sh -c 'rm -rf /home/agent/answer.txt /home/agent/real; echo 42 > /home/agent/answer.txt' >/dev/null
OUT=$(denv verify --resume $ENV); echo "$OUT"
assert_contains "$OUT" "reward: 1" "clean answer after the attacks"
denv env destroy $ENV >/dev/null; wait_destroyed $ENV
