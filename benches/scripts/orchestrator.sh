#!/usr/bin/env bash
# Orchestrator benchmarks: engine overhead on 10,000 no-op stages, and a 100-stage chain of
# trivial shell stages through rao, through GNU make (the floor: the same commands, no store)
# and through `dvc repro` (DVC from PyPI), same script.
# Usage: benches/scripts/orchestrator.sh     (builds rao in the dev profile, installs DVC in target/bench-venv)
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build -q   # the whole workspace: same features (and artifacts) as the tests
RAO="${CARGO_TARGET_DIR:-$PWD/target}/debug/rao"
now() { date +%s.%N; }
secs() { python3 -c "print(f'{$2 - $1:.3f}')"; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "== 10,000 no-op stages (noop kind; each depends on the previous and on one at half its index)"
python3 benches/scripts/gen_noop.py 10000 > "$work/noop.yaml"
t0=$(now); "$RAO" validate "$work/noop.yaml" >/dev/null; t1=$(now)
"$RAO" run "$work/noop.yaml" -j 2 >/dev/null 2>&1; t2=$(now)
"$RAO" run "$work/noop.yaml" -j 2 >/dev/null 2>&1; t3=$(now)
echo "validate+compile: $(secs $t0 $t1) s"
echo "cold run:   $(secs $t1 $t2) s total = $(python3 -c "print(f'{($t2-$t1)/10000*1000:.3f}')") ms per stage (target < 0.25)"
echo "cached run: $(secs $t2 $t3) s total = $(python3 -c "print(f'{($t3-$t2)/10000*1000:.3f}')") ms per stage (target < 0.05)"

echo "== 100-stage shell chain: rao vs GNU make vs dvc repro"
mkdir -p "$work/rao" "$work/dvc" "$work/make"
{
  echo "name: chain"
  echo "stages:"
  echo "  s0: {kind: shell, params: {command: 'echo 0 > \${outputs.o}/v'}, outputs: [o]}"
  for i in $(seq 1 99); do
    echo "  s$i: {kind: shell, params: {command: 'cat \${inputs.i}/v > \${outputs.o}/v; echo $i >> \${outputs.o}/v'}, inputs: {i: s$((i-1)).o}, outputs: [o]}"
  done
} > "$work/rao/chain.yaml"
t0=$(now); "$RAO" run "$work/rao/chain.yaml" >/dev/null 2>&1; t1=$(now); "$RAO" run "$work/rao/chain.yaml" >/dev/null 2>&1; t2=$(now)
rao_cold=$(secs $t0 $t1); rao_cached=$(secs $t1 $t2)
echo "rao:  cold $rao_cold s, cached $rao_cached s"

{
  echo "all: v99"
  echo "v0: ; echo 0 > v0"
  for i in $(seq 1 99); do
    echo "v$i: v$((i-1)) ; cat v$((i-1)) > v$i; echo $i >> v$i"
  done
} > "$work/make/Makefile"
t0=$(now); make -s -C "$work/make" >/dev/null; t1=$(now); make -s -C "$work/make" >/dev/null; t2=$(now)
make_cold=$(secs $t0 $t1); make_cached=$(secs $t1 $t2)
echo "make ($(make --version | head -1)):  cold $make_cold s, cached $make_cached s"
python3 -c "print(f'rao / make: {$rao_cold/$make_cold:.2f}x cold (target <= 1.3x), {$rao_cached/$make_cached:.2f}x cached (target <= 2x)')"

VENV=target/bench-venv
[ -x "$VENV/bin/dvc" ] || { python3 -m venv "$VENV"; "$VENV/bin/pip" install -q --disable-pip-version-check dvc; }
DVC="$PWD/$VENV/bin/dvc"
(
  cd "$work/dvc"
  git init -q && git config user.email b@e && git config user.name bench
  "$DVC" init -q
  {
    echo "stages:"
    echo "  s0: {cmd: echo 0 > v0, outs: [v0]}"
    for i in $(seq 1 99); do
      echo "  s$i: {cmd: 'cat v$((i-1)) > v$i; echo $i >> v$i', deps: [v$((i-1))], outs: [v$i]}"
    done
  } > dvc.yaml
)
t0=$(now); (cd "$work/dvc" && "$DVC" repro -q >/dev/null); t1=$(now); (cd "$work/dvc" && "$DVC" repro -q >/dev/null); t2=$(now)
dvc_cold=$(secs $t0 $t1); dvc_cached=$(secs $t1 $t2)
echo "dvc ($("$DVC" --version)):  cold $dvc_cold s, cached $dvc_cached s"
python3 -c "print(f'rao is {$dvc_cold/$rao_cold:.0f}x faster than dvc cold and {$dvc_cached/$rao_cached:.0f}x faster fully cached')"
