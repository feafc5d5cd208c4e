#!/usr/bin/env bash
# The newcomer's path at full size, outside CI: clone the repository afresh, create a new
# virtual environment, run README command 1, and check that the clone reproduced every
# committed output (git status empty, dvc status clean, MLflow parent and children present).
# With CLONES=2 (default) it does this twice from empty caches and compares dvc.lock.
#
#   bash benchmarks/fresh_clone.sh [REPO] [WORKDIR]
#
# Prints install and pipeline times separately. Needs about 7 GB of disk per clone.
set -euo pipefail
repo=$(cd "${1:-$(dirname "$0")/..}" && pwd)
work=${2:-$(mktemp -d /tmp/voicebias-fresh.XXXXXX)}
clones=${CLONES:-2}
mkdir -p "$work"
for i in $(seq 1 "$clones"); do
  dir="$work/clone$i"
  rm -rf "$dir"
  git clone -q "$repo" "$dir"
  cd "$dir"
  t0=$(date +%s)
  python3 -m venv .venv && . .venv/bin/activate && pip install -q -c requirements.lock -e . \
    && pip install -q --no-deps -r requirements-nodeps.txt
  t1=$(date +%s)
  dvc repro > "$work/repro$i.log" 2>&1
  t2=$(date +%s)
  echo "clone $i: install $((t1 - t0)) s, dvc repro $((t2 - t1)) s"
  dirty=$(git status --porcelain)
  if [ -n "$dirty" ]; then echo "clone $i: git status not empty:"; echo "$dirty"; exit 1; fi
  dvc status | grep -q "Data and pipelines are up to date" || { echo "clone $i: dvc status not clean"; dvc status; exit 1; }
  python - <<'PY'
import json
from mlflow.tracking import MlflowClient
marker = json.load(open("mlruns/pipeline_state.json"))
client = MlflowClient("sqlite:///mlruns/mlflow.db")
exp = client.get_experiment_by_name(marker["experiment"])
parents = client.search_runs([exp.experiment_id], "tags.`voicebias.level` = 'pipeline'")
kids = client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{parents[0].info.run_id}'", max_results=10000)
assert len(parents) == 1 and sorted(k.info.run_name for k in kids) == marker["children"], "MLflow store incomplete"
print(f"MLflow: 1 parent, {len(kids)} children")
PY
  deactivate
  cd - > /dev/null
done
if [ "$clones" -ge 2 ]; then
  cmp "$work/clone1/dvc.lock" "$work/clone2/dvc.lock" && echo "dvc.lock identical in both clones: every DVC-tracked output has the same hash"
fi
