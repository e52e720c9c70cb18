#!/usr/bin/env bash
# The whole GPU test suite spread over the lanes of scripts/gpu_lanes.sh: four groups of test files meant to take
# about equal time (from an H200 on 2026-11-28 with -n 14: the backward + flex group ~290 s, MLA / decode / the rest
# ~190 s; the dense forward's files were over 500 s in one lane, so they are split in two), group g running in lane
# g % LANES. With pytest -v each result is a line, so a lane killed at its limit still names its failures.
#   bash scripts/gpu_lanes.sh scripts/lanes/suite.sh scripts/lanes/suite.sh scripts/lanes/suite.sh scripts/lanes/suite.sh
#   (two GPUs: name it twice, each lane then runs two groups; TILEATTN_TRITON=3.9 in the environment runs it under 3.9)
cd "$(dirname "$0")/../.." || exit 2
groups=(
  "tests/dense/test_large_d.py tests/dense/test_sm90_compile.py tests/dense/test_cluster_sm90.py tests/dense/test_sm90_epilogue.py"
  "tests/dense/test_attention.py tests/dense/test_fp8.py tests/dense/test_api.py tests/dense/test_launcher.py"
  "tests/dense/test_backward.py tests/dense/test_backward_split.py tests/flex"
  "tests/mla tests/decode tests/test_dispatch.py tests/test_cli.py tests/test_readme.py tests/integrations
   tests/distributed tests/test_interpreter_bf16.py tests/test_structure.py tests/test_ncu_source_top.py"
)
lane=${LANE:-0}
lanes=${LANES:-1}
mine=()
for g in "${!groups[@]}"; do
  [ $((g % lanes)) -eq "$lane" ] && mine+=("$g")
done
base=$OUT
for g in "${mine[@]}"; do
  files=$(echo ${groups[$g]})  # (one line)
  OUT=$base/suite$g TREE_TIMEOUT=$(( ${SUITE_TIMEOUT:-520} / ${#mine[@]} )) \
    TREE_CMDS=".|python3 -m pytest -v -rf -n ${TEST_WORKERS:-14} -p no:cacheprovider $files" bash scripts/gpu_check.sh tree-run
done
