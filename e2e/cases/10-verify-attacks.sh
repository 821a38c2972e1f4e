# The verify attacks score 0 with source refused, decided at collect: no snapshot, no
# fork, no grader, and --resume leaves the agent running (the next attack execs into it).
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
  assert_contains "$out" 'snapshot     skipped  {"reason":"submission refused"}' "$2: no snapshot"
  assert_contains "$out" 'grade        skipped  {"reason":"submission refused"}' "$2: no grader"
  assert_contains "$out" "agent_frozen: false" "$2: resumed"
}
attack 'ln -s /etc/passwd /home/agent/answer.txt' 'home/agent/answer.txt: symlink'
attack 'mkfifo /home/agent/answer.txt' 'home/agent/answer.txt: fifo'
attack 'echo 42 > /home/agent/real; ln /home/agent/real /home/agent/answer.txt' 'home/agent/answer.txt: hard link'
attack 'mkdir -p /home/agent/answer.txt; ln -s /etc /home/agent/answer.txt/etc' 'home/agent/answer.txt/etc: symlink'
attack 'python3 -c "import socket; socket.socket(socket.AF_UNIX).bind(\"/home/agent/answer.txt\")"' 'home/agent/answer.txt: socket'
attack 'python3 -c "open(\"/home/agent/answer.txt\", \"w\").truncate(100 << 30)"' 'home/agent/answer.txt: submission larger than 256 MiB'
attack 'mkdir -p /home/agent/answer.txt; python3 -c "open(b\"/home/agent/answer.txt/\\xff\\n\", \"w\"); import os; os.symlink(\"/\", b\"/home/agent/answer.txt/\\xffl\")"' 'home/agent/answer.txt/\xffl: symlink'
exec_out $ENV box sh -c 'rm -rf /home/agent/answer.txt /home/agent/real; echo 42 > /home/agent/answer.txt' >/dev/null
OUT=$(denv verify --resume $ENV); echo "$OUT"
assert_contains "$OUT" "reward: 1" "clean answer after the attacks"
denv env destroy $ENV >/dev/null; wait_destroyed $ENV
