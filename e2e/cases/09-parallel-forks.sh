# 16 forks of one version in parallel (one GRPO group), each isolated.
denv project create grpo >/dev/null
printf 'services:\n  box:\n    image: busybox:1.36\n    command: ["sleep","1000000"]\n    volumes: ["w:/work"]\nvolumes: { w: {} }\n' > c.yaml
denv deploy --project grpo -f c.yaml
ENV=$(env_id grpo alpha)
exec_out $ENV box sh -c 'echo base > /work/f' >/dev/null
denv snapshot $ENV
pids=()
for i in $(seq 1 16); do denv fork --name r$i $ENV > fork-$i.log 2>&1 & pids+=($!); done
for p in "${pids[@]}"; do wait $p || { cat fork-*.log; die "a fork failed"; }; done
for i in $(seq 1 16); do
  F=$(env_id grpo r$i)
  exec_out $F box sh -c "echo mine-$i >> /work/f" >/dev/null
done
for i in $(seq 1 16); do
  F=$(env_id grpo r$i)
  assert_eq "$(exec_out $F box cat /work/f | tr '\n' ' ')" "base mine-$i " "fork r$i content"
done
assert_eq "$(exec_out $ENV box cat /work/f)" base "parent content"
for i in $(seq 1 16); do denv env destroy $(env_id grpo r$i) >/dev/null; done
denv env destroy $ENV >/dev/null
for i in $(seq 1 16); do wait_destroyed $(env_id grpo r$i); done
