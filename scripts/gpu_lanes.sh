#!/usr/bin/env bash
# Several GPU jobs at once on a multi-GPU lease, one lane per GPU: device time is charged per machine, so a
# two-GPU machine runs two lanes of tests and sweeps in the time of one. Each lane never shares its GPU, so its
# timings stand as on a one-GPU machine (compare them within one lane's GPU model, as always).
#   bash scripts/gpu_lanes.sh LANE_SCRIPT...      (LANE_TIMEOUT seconds per lane, default 540)
# Lane i runs `bash LANE_SCRIPT_i` with CUDA_VISIBLE_DEVICES=i and OUT=$OUT/lane<i> (a lane script typically
# calls scripts/gpu_check.sh, e.g. its tree-run step). Afterwards every lane's files go into $OUT/lanes.tar.gz
# (the device tool brings back at most 8 files), after each lane's last 40 lines are printed.
# Run pytest in a lane with -v (under xdist each result is a line "[gwN] [ p%] FAILED tests/..."): a lane killed at
# its time limit prints no summary, and -q's progress dots do not name a failed test (tree-run prints those lines).
set -u
OUT=${OUT:-/tmp/tileattn-out}
mkdir -p "$OUT"
i=0
pids=()
for script in "$@"; do
  mkdir -p "$OUT/lane$i"
  # each lane its own Triton cache, so that lanes of pytest workers never compile into one cache at once
  # (LANE / LANES: a lane script that splits work by lane, e.g. scripts/lanes/suite.sh)
  (CUDA_VISIBLE_DEVICES=$i LANE=$i LANES=$# OUT=$OUT/lane$i \
     TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$HOME/.triton/cache}-lane$i \
     timeout "${LANE_TIMEOUT:-540}" bash "$script" \
     > "$OUT/lane$i/lane.log" 2>&1; echo "lane $i ($script) rc=$?" >> "$OUT/lane$i/lane.log") &
  pids+=($!)
  i=$((i + 1))
done
wait "${pids[@]}"
for ((j = 0; j < i; j++)); do
  echo "=== lane $j"
  tail -n 40 "$OUT/lane$j/lane.log"
done
# one file back instead of each lane's logs
tar -czf "$OUT/lanes.tar.gz" -C "$OUT" $(cd "$OUT" && ls -d lane[0-9]*) && rm -rf "$OUT"/lane[0-9]*
