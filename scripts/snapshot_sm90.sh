#!/usr/bin/env bash
# Copy the Gluon kernel and its launch code of another revision to scripts/scratch_old/ (git-ignored), so
# that `python scripts/dev_sm90.py --old` times it beside the current kernel in one GPU run (an A/B that
# does not depend on the lease). On the device, pass the folder with the run's `carry`.
#   bash scripts/snapshot_sm90.sh REV
set -eu
rev=${1:?revision}
dir=scripts/scratch_old
mkdir -p "$dir"
: > "$dir/__init__.py"
git show "$rev:src/tileattn/ops/dense/gluon_sm90.py" \
  | sed 's/^from \. import kernels/from tileattn.ops.dense import kernels/' > "$dir/gluon_sm90.py"
git show "$rev:src/tileattn/ops/dense/launch_sm90.py" \
  | sed 's/^from \.\.\. import hw/from tileattn import hw/; s/^from \.kernels import/from tileattn.ops.dense.kernels import/; s/^from \.launch import/from tileattn.ops.dense.launch import/; s/^from \.fp8 import/from tileattn.ops.dense.fp8 import/; s/from \.gluon_sm90 import/from scripts.scratch_old.gluon_sm90 import/' \
  > "$dir/launch_sm90.py"
echo "$rev" > "$dir/REVISION"
echo "wrote $dir from $rev"
