#!/usr/bin/env bash
# What the fixed code paths cost: the fresh-clone pipeline (README command 1's `dvc repro`,
# empty DVC, response, render, measurement and embedding caches) with the default fixed
# paths and with VOICEBIAS_CODE_PATHS=native, one after the other on this machine, with the
# active virtual environment (stages run as `python -m` from the clone, so the clone's code
# is what runs). Prints each time and their ratio; then whether the fixed-path clone
# reproduced the committed outputs (git status empty) and how many files the native one
# changed.
#
#   . .venv/bin/activate && bash benchmarks/code_paths.sh [REPO] [WORKDIR]
#
# Needs about 7 GB of disk per clone and the machine otherwise idle.
set -euo pipefail
repo=$(cd "${1:-$(dirname "$0")/..}" && pwd)
work=${2:-$(mktemp -d /tmp/voicebias-codepaths.XXXXXX)}
mkdir -p "$work"
declare -A took
for mode in avx2 native; do
  dir="$work/$mode"
  rm -rf "$dir"
  git clone -q "$repo" "$dir"
  cd "$dir"
  t0=$(date +%s.%N)
  VOICEBIAS_CODE_PATHS=$mode dvc repro > "$work/repro-$mode.log" 2>&1
  t1=$(date +%s.%N)
  took[$mode]=$(python3 -c "print(round($t1 - $t0, 1))")
  echo "$mode: dvc repro ${took[$mode]} s; files git status lists: $(git status --porcelain | wc -l)"
  cd - > /dev/null
done
python3 -c "print(f'native / fixed: {${took[native]} / ${took[avx2]}:.3f}')"
