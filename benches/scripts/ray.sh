#!/usr/bin/env bash
# The Ray executor (issue 7): per-stage overhead vs the in-process executor on a 100-stage no-op
# pipeline, and the wall-clock of one large rollout split into 1, 2 and 4 shards (Ray jobs),
# all on a local Ray head started here. Usage: benches/scripts/ray.sh  (after scripts/test has
# installed Ray into target/py)
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build -q   # the whole workspace: same features (and artifacts) as the tests
RAO="$PWD/target/debug/rao"
RAY="$PWD/target/py/bin/ray"
now() { date +%s.%N; }
work=$(mktemp -d)
"$RAY" start --head --node-ip-address=127.0.0.1 --dashboard-host=127.0.0.1 --port=46391 --dashboard-port=48291 --num-cpus=4 --disable-usage-stats >/dev/null
trap '"$RAY" stop --force >/dev/null 2>&1; rm -rf "$work"' EXIT
ADDR=http://127.0.0.1:48291
until curl -sf "$ADDR/api/jobs/" >/dev/null; do sleep 0.5; done

echo "== 100 no-op stages (a chain with fan-in), cold"
python3 benches/scripts/gen_noop.py 100 > "$work/noop.yaml"
t0=$(now); "$RAO" run "$work/noop.yaml" --store "$work/s-local" >/dev/null 2>&1; t1=$(now)
"$RAO" run "$work/noop.yaml" --store "$work/s-ray" --executor ray --ray-address $ADDR -j 4 >/dev/null 2>&1; t2=$(now)
python3 -c "l=$t1-$t0; r=$t2-$t1; print(f'in-process: {l/100*1000:.1f} ms per stage; ray: {r/100*1000:.0f} ms per stage ({r/l:.0f}x the in-process overhead)')"

echo "== one rollout (scripted expert, 400 Hard tasks x 8 trees) split into shards, Ray jobs, -j 4"
for n in 1 2 4; do
  shards=$(python3 -c "print(list(range($n)))")
  cat > "$work/roll$n.yaml" <<YAML
name: shards-$n
stages:
  tasks: {kind: synthesize, params: {bands: [hard], per_band: 400, task_seed: 1}}
  rollout:
    kind: rollout
    matrix: {shard: $shards}
    inputs: {tasks: tasks.tasks}
    params: {policy: expert, group_size: 8, limits: {window: 96, max_nodes: 512}, shard: {index: "\${matrix.shard}", count: $n}}
  judge: {kind: judge, inputs: {trees: rollout.trees, tasks: tasks.tasks}, params: {mode: exact}}
YAML
  t0=$(now); "$RAO" run "$work/roll$n.yaml" --store "$work/r$n" --executor ray --ray-address $ADDR -j 4 >/dev/null 2>&1; t1=$(now)
  python3 -c "print(f'{$n} shard(s): {$t1-$t0:.1f} s')"
done
echo "(this machine: $(nproc) cores)"
