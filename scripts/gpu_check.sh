#!/usr/bin/env bash
# The one GPU entry point: GPU tests, then the requested benchmark steps; full logs under $OUT.
#   TILEATTN_COMMIT=<sha sent> bash scripts/gpu_check.sh [diag] [host] [tests] [hf-tests] [readme-tests] [sanitize] [sweep] [bench] [bench-long]
#                                                        [bench-bf16] [fp8-tests] [bench-fp8] [mla-tests] [sweep-mla-sched] [bench-mla]
#                                                        [flex-tests] [bench-flex] [bench-flex-tail] [flex-small] [sweep-fwd] [bwd-tests] [split-tests] [sweep-bwd] [sweep-bwd-large-d] [ab-bwd] [ab-flex-bwd] [ab-mla] [ncu-bwd] [ncu-mla] [ncu-mla-source] [profile-bwd] [profile-split] [swing] [sanitize-split] [profile-small] [timeline-bwd] [host-ab] [bwd-row] [sanitize-bwd] [sanitize-mla] [bench-bwd]
#                                                        [sweep-large-d] [large-d-tests] [sanitize-large-d] [bench-large-d] [sanitize-flex-bwd] [sanitize-flex-tail]
#                                                        [decode-tests] [sweep-decode] [bench-decode] [ab-large-d]
#                                                        [cp-tests] [bench-cp] [bench-cp-sim] (cp: 2+ GPUs; -sim: one)
#                                                        [ncu-fwd-source] [ncu-mla-source] (stall samples per SASS line)
#                                                        [ncu-fwd] (NCU_CASES: ';'-separated `profile_kernels.py fwd`
#                                                                   argument lists)
#                                                        [tree-run] (TREE_CMDS: "DIR|command" lines run in carried trees)
# Maintainer tools it runs: scripts/sweep.py (config sweeps), scripts/profile_kernels.py (Nsight Compute targets),
# scripts/host_overhead.py, scripts/gpu_diag.py. scripts/compile_sm90_cpu.py needs no GPU.
# Every step runs under `timeout` (a hung kernel must not eat the session's device time).
# (pass the commit from this machine: the device copy's .git, where there is one, is not the tree sent, so
# git there names the wrong commit; the results file records what TILEATTN_COMMIT says)
# Prints a short summary last.
# TILEATTN_TRITON=3.9: run everything under the slim Triton 3.9 in .triton39/ (carried; built here with
# `../shared/tools/slim-triton 3.9.0 .triton39`) instead of the machine's preinstalled 3.6. sm90 compiles with
# the wheel's own ptxas-blackwell (13.4: what a pip install of 3.9 uses) where .triton39/ptxas-blackwell.xz is
# carried too (here, under a triton 3.9 install: `xz -9 -c $(python -c "import triton, os;
# print(os.path.dirname(triton.__file__))")/backends/nvidia/bin/ptxas-blackwell > .triton39/ptxas-blackwell.xz`,
# ~12 MB), else with the machine's CUDA 13.0 ptxas, which compiles several kernels with fewer spills (docs/design/
# backward.md, triton 3.9).
set -u
OUT=${OUT:-/tmp/tileattn-out}
mkdir -p "$OUT"
# TILEATTN_SRC: another copy of the package to run (e.g. a snapshot of one commit, carried), default ./src
export PYTHONPATH=${TILEATTN_SRC:-$PWD/src}:$PWD PYTHONUNBUFFERED=1
if [ "${TILEATTN_TRITON:-}" = "3.9" ]; then
  # one unpacked copy per GPU lane (gpu_lanes.sh runs lanes at once: one lane must not rewrite the ptxas another
  # is running), unpacked again only when the carried files change (their checksums in .unpacked: a warm machine
  # keeps /tmp between calls, and a call that carries another wheel, or no ptxas-blackwell.xz to compile with the
  # machine's ptxas, must not run the earlier call's)
  [ -f .triton39/triton.tar.xz ] || { echo "no .triton39/triton.tar.xz carried"; exit 2; }
  t39=/tmp/t39-gpu${CUDA_VISIBLE_DEVICES:-all}
  stamp=$(cksum .triton39/triton.tar.xz; [ -f .triton39/ptxas-blackwell.xz ] && cksum .triton39/ptxas-blackwell.xz)
  if [ "$(cat "$t39/.unpacked" 2>/dev/null)" != "$stamp" ]; then
    rm -rf "$t39" && mkdir -p "$t39" && tar -xJf .triton39/triton.tar.xz -C "$t39" \
      || { echo "could not unpack .triton39/triton.tar.xz"; exit 2; }
    if [ -f .triton39/ptxas-blackwell.xz ]; then
      xz -dc .triton39/ptxas-blackwell.xz > "$t39/ptxas-blackwell" && chmod +x "$t39/ptxas-blackwell"
    fi
    printf '%s' "$stamp" > "$t39/.unpacked"
  fi
  ptxas=$(command -v ptxas || echo /usr/local/cuda/bin/ptxas)
  # 3.9 compiles sm90 with the tool it calls ptxas-blackwell: the wheel's where carried, else the machine's
  ptxas_bw=$ptxas
  [ -x "$t39/ptxas-blackwell" ] && ptxas_bw=$t39/ptxas-blackwell
  echo "triton 3.9: sm90 compiled by $ptxas_bw ($("$ptxas_bw" --version | tail -n 1))"
  T39_PATH=$t39:  # (steps that set their own PYTHONPATH put it first too)
  export PYTHONPATH=$t39:$PYTHONPATH TRITON_BACKENDS_IN_TREE=1 TRITON_PTXAS_PATH=$ptxas \
    TRITON_PTXAS_BLACKWELL_PATH=$ptxas_bw TRITON_DEFAULT_FP_FUSION=1
fi
ncu_source() {  # NAME CASES SUBCOMMAND KERNEL_REGEX LOG_PATTERN: per ';'-separated case, `profile_kernels.py
  # SUBCOMMAND <case>` under Nsight Compute with warp stall sampling per SASS instruction (kernels matching
  # KERNEL_REGEX); the report $OUT/NAME_<i>.ncu-rep, its source page as CSV (sass; cuda,sass for source lines) and
  # scripts/ncu_source_top.py's summary ("NCUSRC c<i>" lines; NCU_SRC_TOP instructions)
  local name=$1 list=$2 sub=$3 kregex=$4 pattern=$5 c i=0 rep repf view
  local -a cases csvs
  rc=0
  IFS=';' read -ra cases <<< "$list"
  for c in "${cases[@]}"; do
    i=$((i + 1)); rep="$OUT/${name}_$i"
    # shellcheck disable=SC2086  # (a case is an argument list)
    timeout "${NCU_SRC_TIMEOUT:-270}" ncu --clock-control none --profile-from-start off --kernel-name "regex:$kregex" \
      --section SpeedOfLight --section WarpStateStats --section SourceCounters --import-source yes -f -o "$rep" \
      python3 scripts/profile_kernels.py "$sub" $c > "$rep.log" 2>&1 || rc=$?
    csvs=(); repf=$(ls "$rep".ncu-rep* 2>/dev/null | head -n 1)  # (.ncu-rep, or .ncu-repz in newer ncu)
    for view in sass cuda,sass; do
      ncu --import "$repf" --page source --csv --print-source "$view" > "$rep.${view/,/_}.csv" \
        2>> "$rep.log" && [ -s "$rep.${view/,/_}.csv" ] && csvs+=("$rep.${view/,/_}.csv")
    done
    summary+=("$name case $i ($c) rc=$rc, source views: ${#csvs[@]}")
    grep -E "$pattern|ERR|rror" "$rep.log" | cut -c1-170 | head -5
    ncu --import "$repf" --page details 2>/dev/null | grep -E "Duration|DRAM Throughput|Warp Cycles Per Issued" \
      | sed "s/^ */case $i: /"
    [ ${#csvs[@]} -gt 0 ] && python3 scripts/ncu_source_top.py "${csvs[@]}" --tag "c$i" --top "${NCU_SRC_TOP:-25}"
  done
}
ncu_cases() {  # NAME CASES SUBCOMMAND PATTERN NCU_ARGS...: `profile_kernels.py SUBCOMMAND <case>` under Nsight
  # Compute for each ';'-separated case in CASES, each report in $OUT/NAME_<i>.txt, its lines matching PATTERN printed
  local name=$1 list=$2 sub=$3 pattern=$4 c i=0
  local -a cases
  shift 4
  rc=0
  IFS=';' read -ra cases <<< "$list"
  for c in "${cases[@]}"; do
    i=$((i + 1))
    # shellcheck disable=SC2086  # (a case is an argument list)
    timeout 240 ncu --clock-control none --profile-from-start off "$@" python3 scripts/profile_kernels.py "$sub" $c \
      > "$OUT/${name}_$i.txt" 2>&1 || rc=$?
    summary+=("$name case $i ($c) rc=$rc")
    grep -E "$pattern" "$OUT/${name}_$i.txt" | cut -c1-170 | head -60
  done
}
memcheck_synccheck() {  # STEP TIMEOUT TESTFILE KEXPR: the tests under compute-sanitizer's memcheck, then synccheck
  rc=0
  local tool log
  for tool in memcheck synccheck; do
    log="$OUT/$(echo "$1" | tr - _)_$tool.log"
    timeout "$2" compute-sanitizer --tool $tool --print-limit 20 python3 -m pytest -q -x -p no:cacheprovider "$3" \
      -k "$4" > "$log" 2>&1 || rc=$?
    summary+=("$1 $tool rc=$rc: $(grep -E 'ERROR SUMMARY|passed|failed' "$log" | tail -n 2 | tr '\n' ' ')")
  done
}
steps=${*:-diag tests bench}
summary=()
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())" | tee "$OUT/env.txt"
for s in $steps; do
  t0=$(date +%s)
  case $s in
    diag)
      python3 scripts/gpu_diag.py > "$OUT/diag.log" 2>&1; rc=$?
      summary+=("diag rc=$rc: $(grep -E 'matmul|reduction|host overhead' "$OUT/diag.log" | tr '\n' ';')")
      summary+=("  clocks/throttle: $(grep -A1 nvidia-smi "$OUT/diag.log" | grep MHz | tail -n 1)") ;;
    host)
      timeout 120 python3 scripts/host_overhead.py > "$OUT/host.log" 2>&1; rc=$?
      summary+=("host rc=$rc: $(tail -n 4 "$OUT/host.log" | tr '\n' ';')") ;;
    hf-tests)
      timeout 400 python3 -m pytest -q -p no:cacheprovider tests/integrations > "$OUT/hf_tests.log" 2>&1; rc=$?
      summary+=("hf-tests rc=$rc: $(tail -n 1 "$OUT/hf_tests.log")")
      grep -E "^(FAILED|ERROR)|PASSED|passed|failed" "$OUT/hf_tests.log" | head -30 ;;
    readme-tests)
      timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_readme.py > "$OUT/readme_tests.log" 2>&1; rc=$?
      summary+=("readme-tests rc=$rc: $(tail -n 1 "$OUT/readme_tests.log")")
      grep -E "^(FAILED|ERROR)" "$OUT/readme_tests.log" | head -20 ;;
    tests)
      timeout ${TEST_TIMEOUT:-420} python3 -m pytest -q ${TEST_ARGS:--x} -n ${TEST_WORKERS:-4} -p no:cacheprovider tests > "$OUT/tests.log" 2>&1; rc=$?
      summary+=("tests rc=$rc: $(tail -n 1 "$OUT/tests.log")") ;;
    sanitize)
      # ragged shapes through both kernels: B2-Sq127 (D=64) and B1-Sq1 (D=128) take the Gluon kernel on an
      # H100, varlen the portable one; sm90_dispatch runs both on one problem
      timeout 400 compute-sanitizer --tool memcheck --print-limit 20 python3 -m pytest -q -x -p no:cacheprovider \
        tests/dense/test_attention.py -k "gpu_matrix and fp16 and (B2-Sq127 or B1-Sq1-) or gpu_varlen or sm90_dispatch or sm90_persistent" \
        > "$OUT/sanitize.log" 2>&1; rc=$?
      summary+=("sanitize rc=$rc: $(grep -E 'ERROR SUMMARY|passed|failed' "$OUT/sanitize.log" | tail -n 2 | tr '\n' ' ')") ;;
    sanitize-flex-bwd)
      # the flex Hopper backward (dQ turns counted in the block lists, the merged walk) under memcheck: a score
      # mod with a causal mask, GQA with query blocks that see no key, no block mask / torch's noop mask
      timeout 300 compute-sanitizer --tool memcheck --print-limit 20 python3 -m pytest -q -x -p no:cacheprovider \
        tests/flex/test_flex_backward.py -k "gpu_flex_backward_sm90 and (alibi_causal-128-bf16 or document-64-fp16 or gqa or noop)" \
        > "$OUT/sanitize_flex_bwd.log" 2>&1; rc=$?
      summary+=("sanitize-flex-bwd rc=$rc: $(grep -E 'ERROR SUMMARY|passed|failed' "$OUT/sanitize_flex_bwd.log" | tail -n 2 | tr '\n' ' ')") ;;
    sanitize-flex-tail)
      # the flex Hopper kernels at lengths that are not multiples of 128 under memcheck (sums and counters sized by
      # whole mask blocks, the ragged block taken out of a full list)
      timeout 300 compute-sanitizer --tool memcheck --print-limit 20 python3 -m pytest -q -p no:cacheprovider \
        tests/flex/test_flex.py tests/flex/test_flex_backward.py -k "ragged and (333-517 or full_block or d64 or 77)" \
        > "$OUT/sanitize_flex_tail.log" 2>&1; rc=$?
      summary+=("sanitize-flex-tail rc=$rc: $(grep -E 'ERROR SUMMARY|passed|failed' "$OUT/sanitize_flex_tail.log" | tail -n 2 | tr '\n' ' ')") ;;
    sanitize-bwd)
      # the dense Hopper backward under memcheck and synccheck: D=128 (dQ as TMA reduce-adds), causal and windows,
      # Sq != Sk, GQA, the persistent walks; plan replays (the workspace's pieces passed as addresses), D=64 too
      memcheck_synccheck sanitize-bwd 300 tests/dense/test_backward.py \
        "gpu_backward_sm90 and fp16 and D128 or persistent_walks or poisoned_counters or zeroed_sums or plan_replay" ;;
    sanitize-mla)
      # the MLA Hopper kernels under memcheck and synccheck, every tensor its own allocation (no caching allocator:
      # a read just outside a tensor is then outside any allocation, which memcheck reports): the QK_SHARD kernel
      # at page 32 (2a5fc90's loader read 4 bytes before the block table there; 6fb06b0 fixed it), and several
      # tiles per CTA (16-bit and fp8 caches, page 64)
      PYTORCH_NO_CUDA_MEMORY_CACHING=1 memcheck_synccheck sanitize-mla 280 tests/mla/test_mla.py \
        "qk_shard and (causal-64-1-32 or full-128-1-32) or few_ctas" ;;
    sanitize-large-d)
      timeout 300 compute-sanitizer --tool memcheck --print-limit 20 python3 -m pytest -q -x -p no:cacheprovider \
        tests/dense/test_large_d.py -k "gpu_large_d and fp16 and (D320-Dv320 or D576-Dv512 or D1024) and (full or causal) or gpu_large_d_sm90 and Sq300 and (D576 or D520 or D256 or D200 or D264)" \
        > "$OUT/sanitize_large_d.log" 2>&1; rc=$?
      summary+=("sanitize-large-d rc=$rc: $(grep -E 'ERROR SUMMARY|passed|failed' "$OUT/sanitize_large_d.log" | tail -n 2 | tr '\n' ' ')") ;;
    sweep)
      python3 scripts/sweep.py dense --out "$OUT/sweep.json" --budget-s ${SWEEP_BUDGET:-330} > "$OUT/sweep.log" 2>&1; rc=$?
      summary+=("sweep rc=$rc"); grep -E "^BEST|^  D=" "$OUT/sweep.log" ;;
    bench)
      timeout 480 python3 -m tileattn bench dense --out "$OUT/dense.json" --plot "$OUT/dense.png" ${BENCH_ARGS:-} > "$OUT/bench.log" 2>&1; rc=$?
      summary+=("bench rc=$rc: $(grep '^summary' "$OUT/bench.log")") ;;
    bench-long)
      # the persistent-kernel seed's grid (S0): N 1K-64K with one CTA per tile and fp8 columns; two processes (the
      # 32K / 64K rows appended), so that a timeout in the second keeps the first's rows
      timeout 400 python3 -m tileattn bench dense --long --seqlens 1024,2048,4096,8192,16384 \
        --out "$OUT/dense.json" --plot "$OUT/dense.png" > "$OUT/bench_long.log" 2>&1; rc=$?
      [ -f "$OUT/dense.json" ] && timeout ${LONG_TIMEOUT:-300} python3 -m tileattn bench dense --long \
        --seqlens 32768,65536 --append "$OUT/dense.json" --out "$OUT/dense.json" --plot "$OUT/dense.png" \
        >> "$OUT/bench_long.log" 2>&1 || rc=$?
      summary+=("bench-long rc=$rc: $(grep '^summary' "$OUT/bench_long.log" | tail -n 1)") ;;
    bench-bf16)
      python3 -m tileattn bench dense --dtype bf16 --out "$OUT/dense_bf16.json" --plot "$OUT/dense_bf16.png" > "$OUT/bench_bf16.log" 2>&1; rc=$?
      summary+=("bench-bf16 rc=$rc: $(grep '^summary' "$OUT/bench_bf16.log")") ;;
    bench-fp8)
      timeout 560 python3 -m tileattn bench fp8 --out "$OUT/fp8.json" ${FP8_ARGS:-} > "$OUT/bench_fp8.log" 2>&1; rc=$?
      summary+=("bench-fp8 rc=$rc: $(grep '^summary' "$OUT/bench_fp8.log")") ;;
    fp8-tests)
      timeout 400 python3 -m pytest -q -n ${TEST_WORKERS:-4} -p no:cacheprovider tests/dense/test_fp8.py > "$OUT/fp8_tests.log" 2>&1; rc=$?
      summary+=("fp8-tests rc=$rc: $(tail -n 1 "$OUT/fp8_tests.log")")
      grep -E "^(FAILED|ERROR)" "$OUT/fp8_tests.log" | head -10 ;;
    mla-tests)
      timeout ${MLA_TESTS_TIMEOUT:-300} python3 -m pytest -q -n ${TEST_WORKERS:-4} -p no:cacheprovider tests/mla ${MLA_TESTS_ARGS:-} > "$OUT/mla_tests.log" 2>&1; rc=$?
      summary+=("mla-tests rc=$rc: $(tail -n 1 "$OUT/mla_tests.log")")
      grep -E "^(FAILED|ERROR)" "$OUT/mla_tests.log" | head -20 ;;
    decode-tests)
      timeout 400 python3 -m pytest -q -n ${TEST_WORKERS:-4} -p no:cacheprovider tests/decode > "$OUT/decode_tests.log" 2>&1; rc=$?
      summary+=("decode-tests rc=$rc: $(tail -n 1 "$OUT/decode_tests.log")")
      grep -E "^(FAILED|ERROR)" "$OUT/decode_tests.log" | head -20 ;;
    sweep-decode)
      timeout 420 python3 scripts/sweep.py decode ${SWEEP_ARGS:-} > "$OUT/sweep_decode.log" 2>&1; rc=$?
      summary+=("sweep-decode rc=$rc"); grep -E "^DEC|^read" "$OUT/sweep_decode.log" ;;
    bench-decode)
      timeout 560 python3 -m tileattn bench decode --out "$OUT/decode.json" ${DECODE_ARGS:-} > "$OUT/bench_decode.log" 2>&1; rc=$?
      summary+=("bench-decode rc=$rc: $(grep '^summary' "$OUT/bench_decode.log")")
      cat "$OUT/bench_decode.log" | grep -v "^summary" | head -150 ;;
    ab-large-d)
      # the pre-restructure tree (.ab/src, carried) and this one, in the same run, D = 256 only
      for tree in .ab/src src; do
        PYTHONPATH=$PWD/$tree timeout 150 python3 -m tileattn bench large-d --head-dims 256 --out "$OUT/ab_$(echo $tree | tr -d ./).json" > "$OUT/ab.log" 2>&1
        summary+=("ab-large-d $tree: $(grep '^summary' "$OUT/ab.log" | grep -o 'vs_[a-z]*_H48_D256_[a-z]*=[0-9.]*' | tr '\n' ' ')")
      done ;;
    sweep-mla-sched)
      timeout ${MLA_SCHED_TIMEOUT:-300} python3 scripts/sweep.py mla-sched ${MLA_SCHED_ARGS:-} > "$OUT/sweep_mla_sched.log" 2>&1; rc=$?
      summary+=("sweep-mla-sched rc=$rc"); cat "$OUT/sweep_mla_sched.log" ;;
    bench-mla)
      # MLA_ARGS: e.g. "--groups hq128,qk_shard"; MLA_TIMEOUT: the step's limit in seconds
      timeout ${MLA_TIMEOUT:-540} python3 -m tileattn bench mla --out "$OUT/mla.json" ${MLA_ARGS:-} > "$OUT/bench_mla.log" 2>&1; rc=$?
      summary+=("bench-mla rc=$rc: $(grep '^summary' "$OUT/bench_mla.log")")
      grep -v "^summary" "$OUT/bench_mla.log" | head -120 ;;
    flex-tests)
      timeout 400 python3 -m pytest -q -n ${TEST_WORKERS:-4} -p no:cacheprovider tests/flex > "$OUT/flex_tests.log" 2>&1; rc=$?
      summary+=("flex-tests rc=$rc: $(tail -n 1 "$OUT/flex_tests.log")")
      grep -E "^(FAILED|ERROR)" "$OUT/flex_tests.log" | head -10 ;;
    bench-flex)
      timeout ${FLEX_TIMEOUT:-580} python3 -m tileattn bench flex --out "$OUT/flex.json" > "$OUT/bench_flex.log" 2>&1; rc=$?
      summary+=("bench-flex rc=$rc: $(grep '^summary' "$OUT/bench_flex.log")")
      grep -v Warn "$OUT/bench_flex.log" | head -30 ;;
    bench-flex-tail)
      # the flex bench at a length that is not a multiple of 128 (FLEX_TAIL_N, default 8000): the Hopper kernels'
      # tail mode against torch's compiled flex
      timeout ${FLEX_TIMEOUT:-580} python3 -c "from tileattn.bench.flex import run; run(out_json='$OUT/flex_tail.json', seqlens=(${FLEX_TAIL_N:-8000},))" > "$OUT/bench_flex_tail.log" 2>&1; rc=$?
      summary+=("bench-flex-tail rc=$rc: $(grep '^summary' "$OUT/bench_flex_tail.log")")
      grep -v Warn "$OUT/bench_flex_tail.log" | head -40 ;;
    flex-small)
      # the flex forward at a short N (host time against kernel time, ours and torch flex's; cProfile of ours)
      timeout 300 python3 scripts/profile_kernels.py flex-small --N ${FLEX_SMALL_N:-2048} > "$OUT/flex_small.log" 2>&1; rc=$?
      summary+=("flex-small rc=$rc")
      grep -E "^FLEX|[Ss]ync" "$OUT/flex_small.log" | head -30 ;;
    bwd-tests)
      # 254 tests: more than 400 s on the H100 machine with 4 workers (2026-11-28), so it no longer fits one device
      # command beside bench-bwd; BWD_TESTS_K narrows it (a pytest -k expression)
      timeout ${BWD_TESTS_TIMEOUT:-560} python3 -m pytest -q -n ${TEST_WORKERS:-4} -p no:cacheprovider tests/dense/test_backward.py tests/dense/test_backward_split.py tests/flex/test_flex_backward.py ${BWD_TESTS_K:+-k "$BWD_TESTS_K"} > "$OUT/bwd_tests.log" 2>&1; rc=$?
      summary+=("bwd-tests rc=$rc: $(tail -n 1 "$OUT/bwd_tests.log")")
      grep -E "^(FAILED|ERROR)" "$OUT/bwd_tests.log" | head -10 ;;
    split-tests)
      # the split backward (D > 128) with its Hopper score kernel at D = 256: its own tests, the D=256 / 320 / 512
      # rows of the backward matrix, the determinism test
      timeout ${SPLIT_TIMEOUT:-300} python3 -m pytest -q -n ${TEST_WORKERS:-4} -p no:cacheprovider tests/dense/test_backward_split.py \
        tests/dense/test_backward.py -k "split or gpu_backward and (256 or 320 or 512) or large_d" > "$OUT/split_tests.log" 2>&1; rc=$?
      summary+=("split-tests rc=$rc: $(tail -n 1 "$OUT/split_tests.log")")
      grep -E "^(FAILED|ERROR)" "$OUT/split_tests.log" | head -10 ;;
    sweep-fwd)
      # the Hopper forward's table config against variants (FWD_ARGS: sweep.py fwd options), compiled in parallel
      for d in 64 128; do for c in 0 1; do
        timeout 300 python3 scripts/sweep.py fwd --warm --dims $d --causal $c ${FWD_ARGS:-} >> "$OUT/sweep_fwd_warm.log" 2>&1 &
      done; done; wait
      timeout ${FWD_TIMEOUT:-300} python3 scripts/sweep.py fwd ${FWD_ARGS:-} > "$OUT/sweep_fwd.log" 2>&1; rc=$?
      summary+=("sweep-fwd rc=$rc"); grep -E "^FWD" "$OUT/sweep_fwd.log" ;;
    sweep-bwd)
      timeout 500 python3 scripts/sweep.py bwd ${SWEEP_ARGS:-} > "$OUT/sweep_bwd.log" 2>&1; rc=$?
      summary+=("sweep-bwd rc=$rc"); grep -E "^(D=|FLEX)" "$OUT/sweep_bwd.log" ;;
    sweep-bwd-large-d)
      timeout ${BWDL_TIMEOUT:-400} python3 scripts/sweep.py bwd-large-d ${BWDL_ARGS:-} > "$OUT/sweep_bwd_large_d.log" 2>&1; rc=$?
      summary+=("sweep-bwd-large-d rc=$rc"); grep -E "^BWDL" "$OUT/sweep_bwd_large_d.log" | cut -c1-400 ;;
    ab-mla)
      # MLA decode (MLADecodePlan.run, outputs checked) of the trees before this change (.ab/src, .ab2/src where
      # carried) and of this one, alternated twice: "shape tree eager ms graph ms" lines sorted by shape, a line
      # per tree and repeat (AB_MLA_SHAPES: `sweep.py mla-sched --shapes`, BxKVxHQxSQ;...)
      rc=0
      for rep in 1 2; do for tree in .ab/src .ab2/src src; do
        [ -d $tree ] || continue
        PYTHONPATH=$PWD/$tree:${T39_PATH:-}$PWD timeout 200 python3 scripts/sweep.py mla-sched --shapes \
          "${AB_MLA_SHAPES:-128x1024x16x1;128x1024x64x1;128x2048x64x1;128x1024x128x1;768x1024x16x1;768x1024x64x1}" \
          > "$OUT/ab_mla_tmp.log" 2>&1 || rc=$?
        sed "s#^#$tree #" "$OUT/ab_mla_tmp.log" >> "$OUT/ab_mla.log"
      done; done
      summary+=("ab-mla rc=$rc, outputs wrong: $(grep -c WRONG "$OUT/ab_mla.log")")
      awk '/SCHED/{sh=$3" "$4" "$5" "$6} /eager/{for(i=1;i<=NF;i++){if($i=="eager")e=$(i+1); if($i=="graph")g=$(i+1)};
           print sh, $1, "eager", e, "graph", g}' "$OUT/ab_mla.log" | sort -s -k1,4 ;;
    ab-bwd)
      # the Hopper backward of the trees before this change (.ab/src, .ab2/src where carried) and of this one,
      # in the same run
      for tree in .ab/src .ab2/src src; do  # compile every tree's variants in parallel first (~1 min, not ~10)
        [ -d $tree ] || continue
        for d in 64 128; do for c in 0 1; do
          PYTHONPATH=$PWD/$tree:${T39_PATH:-}$PWD timeout 300 python3 scripts/sweep.py bwd --warm --dims $d --causal $c \
            >> "$OUT/ab_bwd_warm.log" 2>&1 &
        done; done
      done; wait
      for tree in .ab/src .ab2/src src; do
        [ -d $tree ] || continue
        PYTHONPATH=$PWD/$tree:${T39_PATH:-}$PWD timeout ${AB_TIMEOUT:-190} python3 scripts/sweep.py bwd \
          --only ${AB_ONLY:-sm90} --tag "$tree " ${AB_ARGS:-} >> "$OUT/ab_bwd.log" 2>&1
      done; rc=$?
      summary+=("ab-bwd rc=$rc"); grep -E "^(\.ab2?/src|src) D=" "$OUT/ab_bwd.log" | sort -t' ' -k2,4 -s ;;
    ab-flex-bwd)
      # the flex Hopper backward (N=8192 B=4 H=16 D=128 bf16, `sweep.py bwd-order` at the table's head group) of the
      # trees before this change (.ab/src, .ab2/src where carried) and this one, alternated twice; torch's compiled
      # backward timed beside each as the drift reference (AB_FLEX_MODS: the flex bench's mods, comma-separated).
      # Gradients are not checked here: run tests/flex/test_flex_backward.py on the GPU with it
      rc=0
      for rep in 1 2; do for tree in .ab/src .ab2/src src; do
        [ -d $tree ] || continue
        PYTHONPATH=$PWD/$tree:${T39_PATH:-}$PWD timeout 200 python3 scripts/sweep.py bwd-order --groups 4 \
          --flex-mods "${AB_FLEX_MODS:-alibi_causal,causal,document}" > "$OUT/ab_flex_tmp.log" 2>&1 || rc=$?
        sed "s#^#$tree #" "$OUT/ab_flex_tmp.log" >> "$OUT/ab_flex_bwd.log"
      done; done
      summary+=("ab-flex-bwd rc=$rc"); grep "ORDER flex" "$OUT/ab_flex_bwd.log" | sort -s -k4,4 ;;
    host-ab)
      # host time to issue one backward (ours, cuDNN's, a trivial autograd node's) for the tree before this change
      # (.ab/src, carried) and this one, alternated twice (the host drifts); cProfile of this tree's backward last
      # (HOST_ARGS: `profile_kernels.py host` options, default D=64 causal N=1K)
      rc=0
      for rep in 1 2; do for tree in .ab/src src; do
        [ -d $tree ] || continue
        extra=--no-cprofile; [ $tree = src ] && [ $rep = 2 ] && extra=
        PYTHONPATH=$PWD/$tree:${T39_PATH:-}$PWD timeout 200 python3 scripts/profile_kernels.py host \
          ${HOST_ARGS:---N 1024 --D 64 --causal} --only "${HOST_ONLY:-^(bwd|floor|shaped)}" $extra > "$OUT/host_ab_tmp.log" 2>&1 || rc=$?
        sed "s#^#$tree #" "$OUT/host_ab_tmp.log" >> "$OUT/host_ab.log"
      done; done
      summary+=("host-ab rc=$rc"); grep "HOST N=" "$OUT/host_ab.log" ;;
    bwd-row)
      # the bwd bench's D=64 causal 1K row repeated, fp16 and bf16 (ROW_ARGS: `profile_kernels.py rows` options)
      timeout 400 python3 scripts/profile_kernels.py rows ${ROW_ARGS:-} > "$OUT/bwd_row.log" 2>&1; rc=$?
      summary+=("bwd-row rc=$rc"); grep -E "^ROW|FAILED" "$OUT/bwd_row.log" ;;
    profile-small)
      # timed / kernel / host time of the short rows, each kernel's GPU time (SMALL_ARGS: `profile_kernels.py small` options)
      timeout 300 python3 scripts/profile_kernels.py small --breakdown ${SMALL_ARGS:-} > "$OUT/profile_small.log" 2>&1; rc=$?
      summary+=("profile-small rc=$rc"); grep -E "^SMALL|^    " "$OUT/profile_small.log" ;;
    timeline-bwd)
      # the dense backward's GPU timeline per call: preprocess, main kernel, dQ conversion (TL_ARGS: `profile_kernels.py
      # timeline` options)
      timeout 300 python3 scripts/profile_kernels.py timeline ${TL_ARGS:-} > "$OUT/timeline_bwd.log" 2>&1; rc=$?
      summary+=("timeline-bwd rc=$rc"); grep -E "^TL" "$OUT/timeline_bwd.log" | cut -c1-400 ;;
    sanitize-split)
      # the split backward's Hopper score kernel under memcheck and synccheck: ragged rows / keys, Sq < 64, Sk < 64,
      # zero tiles on both sides of a window, GQA with a softcap
      memcheck_synccheck sanitize-split 200 tests/dense/test_backward_split.py \
        "fp16 and (Sq300-Sk300 or Sq40 or Sk30 or Sk1- or Sq640 or Sq257)" ;;
    profile-split)
      # each kernel's GPU time in the split backward (SPLIT_ARGS: `profile_kernels.py split` options)
      timeout 300 python3 scripts/profile_kernels.py split ${SPLIT_ARGS:-} > "$OUT/profile_split.log" 2>&1; rc=$?
      summary+=("profile-split rc=$rc"); grep "^SPLIT" "$OUT/profile_split.log" | cut -c1-160 ;;
    swing)
      # the split backward's call-to-call swing, with the GPU's clocks, power and throttle reasons logged beside
      timeout 330 nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
        --format=csv -lms 200 > "$OUT/swing_smi.csv" 2>&1 & smi=$!
      timeout 300 python3 scripts/profile_kernels.py swing ${SWING_ARGS:-} > "$OUT/swing.log" 2>&1; rc=$?
      kill $smi 2>/dev/null; wait $smi 2>/dev/null
      summary+=("swing rc=$rc"); grep "^SWING" "$OUT/swing.log" | cut -c1-400
      # samples per (SM clock, throttle reasons: 0x1 idle, 0x4 software power cap)
      awk -F, 'NR>1 {print $2, $6}' "$OUT/swing_smi.csv" | sort | uniq -c | sort -rn | head -8 ;;
    profile-bwd)
      timeout 300 python3 scripts/profile_kernels.py bwd > "$OUT/profile_bwd.log" 2>&1; rc=$?
      summary+=("profile-bwd rc=$rc"); grep "^PROF" "$OUT/profile_bwd.log" ;;
    sweep-large-d)
      timeout 580 python3 scripts/sweep.py large-d ${LARGE_D_ARGS:-} > "$OUT/sweep_large_d.log" 2>&1; rc=$?
      summary+=("sweep-large-d rc=$rc"); grep -E "^(EFF|BEST|CFG)" "$OUT/sweep_large_d.log" | cut -c1-200 ;;
    large-d-tests)
      timeout 500 python3 -m pytest -q -n ${TEST_WORKERS:-4} -p no:cacheprovider tests/dense/test_large_d.py > "$OUT/large_d_tests.log" 2>&1; rc=$?
      summary+=("large-d-tests rc=$rc: $(tail -n 1 "$OUT/large_d_tests.log")")
      grep -E "^(FAILED|ERROR)" "$OUT/large_d_tests.log" | head -10 ;;
    bench-large-d)
      timeout 560 python3 -m tileattn bench large-d --out "$OUT/large_d.json" ${LARGE_D_BENCH_ARGS:-} > "$OUT/bench_large_d.log" 2>&1; rc=$?
      summary+=("bench-large-d rc=$rc: $(grep '^summary' "$OUT/bench_large_d.log" | cut -c1-400)")
      grep -E "^  B=|CHECK" "$OUT/bench_large_d.log" ;;
    ncu-fwd)
      ncu_cases ncu_fwd "${NCU_CASES:---provider tileattn --D 1024 --causal;--provider tileattn --H 8 --N 16384 --D 256;--provider cudnn --H 8 --N 16384 --D 256}" fwd \
        "^  [a-zA-Z_0-9]+.*\(|Duration|Compute \(SM\) Throughput|Memory Throughput|L1/TEX Cache Throughput|L2 Cache Throughput|DRAM Throughput|Registers Per Thread|Shared Memory Configuration Size|Dynamic Shared Memory Per Block|Achieved Occupancy|Issue Slots Busy|Executed Ipc Active|Mem Pipes Busy|Max Bandwidth|Stall|Shared Memory  " \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
        --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section LaunchStats --section Occupancy ;;
    ncu-mla)
      # NCU_MLA_CASES: ';'-separated `profile_kernels.py mla-one` argument lists; default batch 128 at kv 1K and 4K
      # (the kernel time's intercept: 26 us + 50 us per 1K tokens)
      ncu_cases ncu_mla "${NCU_MLA_CASES:---kv 1024;--kv 4096}" mla-one \
        "^MLA|^  [a-zA-Z_0-9]+.*\(|Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Registers Per Thread|Dynamic Shared Memory Per Block|Achieved Occupancy|Issue Slots Busy|Stall|Warp Cycles|Grid Size|Waves Per SM|One or More Eligible|No Eligible" \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats \
        --section Occupancy --section SchedulerStats ;;
    ncu-mla-source)
      # where the MLA kernel's warps wait: Nsight Compute's warp stall samples per SASS instruction (SourceCounters)
      # of one MLA decode per case (NCU_MLA_CASES: ';'-separated `profile_kernels.py mla-one` argument lists; default
      # batch 768, kv 1K, Hq 64 with a bf16 and an fp8 cache). Per case: the report ($OUT/ncu_mla_src_<i>.ncu-rep),
      # its source page as CSV (sass; cuda,sass for the source lines) and scripts/ncu_source_top.py's summary: stall
      # reasons, samples per opcode and partition, mbarrier waits by barrier, the top NCU_SRC_TOP instructions
      ncu_source ncu_mla_src "${NCU_MLA_CASES:---batch 768 --kv 1024 --hq 64;--batch 768 --kv 1024 --hq 64 --fp8}" \
        mla-one mla_split "^MLA" ;;
    ncu-fwd-source)
      # the same for the dense Hopper forward (NCU_FWD_CASES: `profile_kernels.py fwd` argument lists; default D=128
      # N=4K B=4 H=32 non-causal, fp16 and e4m3: issue 23's fp8_vs_fp16_min_d128_n4k row)
      ncu_source ncu_fwd_src "${NCU_FWD_CASES:---B 4 --H 32 --N 4096 --D 128;--B 4 --H 32 --N 4096 --D 128 --fp8}" \
        fwd attn_fwd_sm90 "^FWD" ;;
    ncu-bwd)
      # NCU_BWD_CASES: ';'-separated `profile_kernels.py bwd-one` argument lists; the Hopper backward (forced on) and
      # cuDNN's by default. Kernels whose name has "bwd" or "dgrad" (cuDNN's) only
      TILEATTN_SM90_BWD=1 ncu_cases ncu_bwd "${NCU_BWD_CASES:---provider tileattn;--provider cudnn}" bwd-one \
        "^  [a-zA-Z_0-9]+.*\(|Duration|Compute \(SM\) Throughput|Memory Throughput|L1/TEX Cache Throughput|Registers Per Thread|Dynamic Shared Memory Per Block|Issue Slots Busy|Executed Ipc Active|Shared|Bank|Stall|Warp Cycles|Tensor|Pipe" \
        --kernel-name regex:"bwd|dgrad|dq|dkdv" --section SpeedOfLight --section ComputeWorkloadAnalysis \
        --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section WarpStateStats \
        --section LaunchStats --section InstructionStats ;;
    cp-tests)
      # ring_attention over NCCL, one rank per GPU, against the whole-sequence reference (needs 2+ GPUs)
      timeout 400 python3 -m pytest -q -p no:cacheprovider tests/distributed > "$OUT/cp_tests.log" 2>&1; rc=$?
      summary+=("cp-tests rc=$rc: $(tail -n 1 "$OUT/cp_tests.log")")
      grep -E "^(FAILED|ERROR)|SKIPPED" "$OUT/cp_tests.log" | head -10 ;;
    bench-cp)
      timeout ${CP_TIMEOUT:-500} python3 -m tileattn bench cp --out "$OUT/cp.json" ${CP_ARGS:-} > "$OUT/bench_cp.log" 2>&1; rc=$?
      summary+=("bench-cp rc=$rc: $(grep '^summary' "$OUT/bench_cp.log")")
      grep -v Warn "$OUT/bench_cp.log" | tail -n 30 ;;
    bench-cp-sim)
      timeout 400 python3 -m tileattn bench cp --simulate --out "$OUT/cp_sim.json" > "$OUT/bench_cp_sim.log" 2>&1; rc=$?
      summary+=("bench-cp-sim rc=$rc: $(grep '^summary' "$OUT/bench_cp_sim.log")")
      grep -v Warn "$OUT/bench_cp_sim.log" | tail -n 20 ;;
    bench-bwd)
      timeout 580 python3 -m tileattn bench bwd --out "$OUT/bwd.json" ${BWD_ARGS:-} > "$OUT/bench_bwd.log" 2>&1; rc=$?
      summary+=("bench-bwd rc=$rc: $(grep '^summary' "$OUT/bench_bwd.log")")
      grep -v Warn "$OUT/bench_bwd.log" | head -40 ;;
    tree-run)
      # TREE_CMDS: newline-separated "DIR|command" lines; each command runs with bash in DIR (a carried tree, e.g. a
      # branch's `git archive BRANCH src tests scripts | tar -x -C .ab`) with PYTHONPATH on DIR's src, under
      # TREE_TIMEOUT seconds (kernels never run before may hang): several branches' GPU tests and sweeps in one call
      i=0
      while IFS= read -r line; do
        [ -z "$line" ] && continue
        i=$((i + 1)); dir=${line%%|*}; cmd=${line#*|}
        (cd "$dir" && PYTHONPATH=${T39_PATH:-}$PWD/src:$PWD timeout "${TREE_TIMEOUT:-240}" bash -c "$cmd") \
          > "$OUT/tree_run_$i.log" 2>&1; rc=$?
        summary+=("tree-run $i ($dir: ${cmd:0:90}) rc=$rc: $(tail -n 1 "$OUT/tree_run_$i.log" | cut -c1-160)")
        grep -E "^(FAILED|ERROR)|\] (FAILED|ERROR) |^FWD|^SCHED|^  w[0-9]" "$OUT/tree_run_$i.log" | cut -c1-220 | head -40
      done <<< "${TREE_CMDS:-}" ;;
    *) echo "unknown step $s"; continue ;;
  esac
  summary+=("  ($s took $(( $(date +%s) - t0 )) s)")
done
[ -f "$OUT/bench.log" ] && sed -n '/^D=/,$p' "$OUT/bench.log" | head -60
echo "=== summary"
printf '%s\n' "${summary[@]}"
