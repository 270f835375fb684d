#!/usr/bin/env bash
# Issue 28 on one GPU machine: ranked steps of at most 5 minutes each, resumable (a rerun skips the steps already
# done in $RESULTS, and `bench --resume` keeps the points already measured). The device calls to make, in order,
# are in benchmarks/gpu_plan.md.
#
#   bash benchmarks/gpu_run.sh [STEP[:CAP]...]   (default: every step below, in rank order, within $DEADLINE s)
#
# Ranks: 1 cuDNN correctness + dense_blocks at 1M; 2 until-oom (>= 8M tokens in 80 GB) + plan --check;
# 3 FlashAttention-4 (staged wheels, compile time apart, rows); 4 peers; 5 CUDA verify of the features, verify at 1M.
# Every report goes to $RESULTS (default /tmp/gpu_results); after each step the folder is packed into
# $OUT/gpu_results.tgz (the device tool brings back few files) and the log copied to $OUT/gpu_run.log.
# Carried wheels: .whl/ (pydantic, which the image lacks) and .fa4/a, .fa4/b (benchmarks/stage_wheels.sh) are
# installed into .gpu_site/ (git-ignored, kept on a warm machine between calls). On an H200, until-oom runs with
# --max-memory 79GiB (torch.cuda.set_per_process_memory_fraction), labelled "emulated 80 GB".
# DEVICE=cpu runs the same steps with tiny sizes, to check the script itself on a machine without a GPU.
set -u
OUT=${OUT:-gpu_out}; RESULTS=${RESULTS:-/tmp/gpu_results}; DEADLINE=${DEADLINE:-560}; DEVICE=${DEVICE:-cuda}
STEP_CAP=300
mkdir -p "$OUT" "$RESULTS"
LOG=$RESULTS/gpu_run.log
SITE=$PWD/.gpu_site
if ! python3 -c "import pydantic" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1 && [ ! -e "$SITE/.base" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
    && touch "$SITE/.base" || exit 1
fi
export PYTHONPATH=$PWD:$SITE PYTHONUNBUFFERED=1
# pip --target runs no .pth file, and nvidia-cutlass-dsl puts its `cutlass` package on sys.path through one: the
# folder is named here, before fa4_install makes it, so that every later step (a new shell) finds it
export PYTHONPATH=$PYTHONPATH:$SITE/nvidia_cutlass_dsl/dsl_packages
dattn() { python3 -m dattn_cli "$@"; }
pack() { cp "$LOG" "$OUT/gpu_run.log"; tar czf "$OUT/gpu_results.tgz" -C "$RESULTS" . ; }

# step NAME CAP CMD...: run CMD (a function below) with at most CAP seconds and what is left before DEADLINE.
step() {
  local name=$1 cap=$2; shift 2
  if [ -e "$RESULTS/done.$name" ]; then echo "== $name: done before, skipped" | tee -a "$LOG"; return; fi
  local left=$((DEADLINE - SECONDS))
  if [ "$left" -lt 15 ]; then echo "== $name: not started, ${left}s left" | tee -a "$LOG"; return; fi
  [ "$cap" -gt "$STEP_CAP" ] && cap=$STEP_CAP
  [ "$cap" -gt "$left" ] && cap=$left
  echo "== $name (cap ${cap}s, at ${SECONDS}s)" | tee -a "$LOG"
  local t0=$SECONDS
  timeout -k 5 "$cap" bash -c "$*" >>"$LOG" 2>&1
  local rc=$?
  echo "== $name: rc=$rc in $((SECONDS - t0))s at ${SECONDS}s" | tee -a "$LOG"
  [ "$rc" -eq 0 ] && touch "$RESULTS/done.$name"
  pack
}

if [ "$DEVICE" = cuda ]; then BIG=1; else BIG=0; fi
sizes() { [ "$BIG" = 1 ] && echo "$1" || echo "$2"; }   # sizes GPU CPU-check
DTYPE=$(sizes bfloat16 float32)
SHAPE="--batch 1 --heads 8 --head-dim 64 --segments 2048,4096,8192 --dilations 1,2,4"
[ "$BIG" = 1 ] || SHAPE="--batch 1 --heads 4 --head-dim 16 --segments 256,512,1024 --dilations 1,2,4"
card() { [ "$BIG" = 1 ] && nvidia-smi --query-gpu=name --format=csv,noheader | head -1 || echo cpu; }
# 80 GB: an H200 is held to 79 GiB, labelled as emulated; an 80 GB card runs as it is; the CPU check: 2 GiB
memory_cap() {
  case "$(card)" in *H200*) echo "--max-memory 79GiB" ;; cpu) echo "--max-memory 2GiB" ;; *) echo "" ;; esac
}
memory_label() { case "$(card)" in *H200*) echo "emulated 80 GB (H200 at --max-memory 79GiB)" ;; *) card ;; esac; }

# --- 1: cuDNN correctness, dense blocks at 1M ----------------------------------------------------------------
env_info() {
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv 2>&1 || true
  python3 -c 'import torch; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), torch.cuda.is_available() and torch.cuda.get_device_name())'
  python3 -m pip list 2>/dev/null | grep -i -E "^(torch|triton|flash|nvidia-cudnn|pydantic|typer|rich|scipy) " || true
  dattn env --json "$RESULTS/env.json" && dattn impls --json "$RESULTS/impls.json"
}
tests_cuda() {   # the forced block kernels and the CUDA tests against the reference (skipped cleanly off CUDA)
  python3 -m pytest -q -p no:cacheprovider tests/kernels/test_cuda.py tests/kernels/test_backends.py \
    tests/kernels/test_combine.py tests/kernels/test_merge_fused.py tests/kernels/test_kernel_choice.py \
    tests/kernels/test_peers.py::test_flex_gradients_on_cuda -k "not flex_cuda" --junitxml "$RESULTS/pytest_cuda.xml"
}
dense_blocks_1m() {
  python3 benchmarks/dense_blocks.py --device "$DEVICE" --dtype "$DTYPE" --mode fwdbwd --seq-len "$(sizes 1m 4k)" \
    $(sizes "" "--heads 2 --head-dim 16 --segments 256,512,1024 --repeat 2 --warmup 1") \
    --trace "$RESULTS/profiles" --out "$RESULTS/dense_blocks.jsonl"
}
dense_blocks_more() {   # 64K and 2M, and the D=128 and H_kv=2 neighbours at 1M beside the main shape
  python3 benchmarks/dense_blocks.py --device "$DEVICE" --dtype "$DTYPE" --seq-len "$(sizes 64k,2m 2k)" \
    $(sizes "" "--heads 2 --head-dim 16 --segments 256,512,1024 --repeat 2 --warmup 1") \
    --trace "$RESULTS/profiles" --out "$RESULTS/dense_blocks.jsonl" || return 1
  python3 benchmarks/dense_blocks.py --device "$DEVICE" --dtype "$DTYPE" --seq-len "$(sizes 1m 4k)" \
    --head-dim "$(sizes 128 32)" $(sizes "" "--heads 2 --segments 256,512,1024 --repeat 2 --warmup 1") \
    --out "$RESULTS/dense_blocks_d128.jsonl" || return 1
  python3 benchmarks/dense_blocks.py --device "$DEVICE" --dtype "$DTYPE" --seq-len "$(sizes 1m 4k)" --kv-heads 2 \
    $(sizes "" "--heads 4 --head-dim 16 --segments 256,512,1024 --repeat 2 --warmup 1") \
    --out "$RESULTS/dense_blocks_kv2.jsonl"
}

# --- 2: until-oom and the planner's check on its rows -----------------------------------------------------------
until_oom() {   # until_oom IMPL START MAX_SECONDS [OPTIONS...]: one line from START doubling until OOM or the time cap
  local impl=$1 start=$2 cap=$3; shift 3
  echo "until_oom $impl on $(memory_label); per-call cap --max-seconds $cap" | tee "$RESULTS/until_oom_$impl.label"
  dattn bench --device "$DEVICE" --dtype "$DTYPE" --mode fwdbwd $SHAPE --impl "$impl" --until-oom --start-seq-len "$start" \
    --repeat 3 --warmup 1 --max-seconds "$cap" $(memory_cap) --resume --out "$RESULTS/until_oom_$impl.jsonl" "$@"
}
oom_improved() { until_oom ImprovedDilatedAttention "$(sizes 1m 16k)" 40; }
plan_check() {
  local profile; profile=$(case "$(card)" in *H200*) echo h200-141gb ;; *H100*PCIe*) echo h100-pcie-80gb ;; cpu) echo cpu-host ;; *) echo h100-sxm-80gb ;; esac)
  dattn plan --check "$RESULTS/until_oom_ImprovedDilatedAttention.jsonl" --profile "$profile" \
    --json "$RESULTS/plan_check_until_oom.json"
}

# --- 3: FlashAttention-4: staged wheels re-joined, installed, compile time apart, rows ----------------------------
fa4_stage_a() {   # first call: keep set a where the next call finds it (an ignored folder survives on a warm machine)
  mkdir -p .fa4_staged && cp -f .fa4/a/* .fa4_staged/ && ls -l .fa4_staged
}
fa4_install() {   # second call (set b carried): re-join the cut wheel, check every sha256, install with no index
  cp -f .fa4/b/* .fa4_staged/ && cd .fa4_staged || return 1
  local first wheel
  for first in parts.*.00; do
    [ -e "$first" ] || continue
    wheel=${first#parts.}; wheel=${wheel%.00}
    cat "parts.$wheel".?? > "$wheel" && rm "parts.$wheel".??
  done
  sha256sum -c manifest.sha256 || return 1
  cd .. && local t0=$SECONDS
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .fa4_staged/*.whl || return 1
  python3 - "$RESULTS/fa4_install.json" "$((SECONDS - t0))" <<'EOF'
import json, sys, time
t = time.perf_counter(); error = None
try:
    import flash_attn.cute.interface  # noqa: F401
except Exception as exc:
    error = f"{type(exc).__name__}: {exc}"
json.dump({"install_s": int(sys.argv[2]), "import_s": time.perf_counter() - t, "error": error}, open(sys.argv[1], "w"))
print("flash_attn.cute import:", error or "ok")
EOF
}
fa4_rows() {   # FA4 on the module's blocks (its compile time: fa4_first_call_s, outside the samples) and dense rows
  python3 benchmarks/dense_blocks.py --device "$DEVICE" --dtype "$DTYPE" --seq-len "$(sizes 64k,1m 4k)" \
    $(sizes "" "--heads 2 --head-dim 16 --segments 256,512,1024 --repeat 2 --warmup 1") \
    --out "$RESULTS/dense_blocks_fa4.jsonl" || return 1
  until_oom flash4 "$(sizes 64k 4k)" 20
}

# --- 4: peers side by side, each its own line (one that cannot run says why and does not stop the others) -------
peers_dense() { until_oom sdpa "$(sizes 64k 4k)" 20; until_oom cudnn "$(sizes 64k 4k)" 20; true; }
peers_flex() { until_oom flex_dilated "$(sizes 64k 1k)" 30 --mode "$(sizes fwdbwd fwd)"; }
peer_site() {   # peer_site fkodom|seed: a folder holding that project's dilated_attention_pytorch (both import under
  # that name, so each gets its own), from the carried .peers/ (benchmarks/stage_wheels.sh peers); empty if absent
  local site=$PWD/.gpu_peers/$1
  if [ ! -e "$site/.done" ] && [ -d ".peers/$1" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" .peers/"$1"/*.whl >&2 || return 0
    [ -d ".peers/$1/src" ] && cp -r .peers/"$1"/src/* "$site/"
    touch "$site/.done"
  fi
  [ -e "$site/.done" ] && echo "$site"
}
peers_head_groups() {   # fkodom and the seed at --semantics head_groups, beside dattn's and FlexAttention's (there c <= 1)
  local impl site
  for impl in ImprovedDilatedAttention fkodom seed flex_dilated; do
    site=$(case $impl in fkodom|seed) peer_site "$impl" ;; esac)
    PYTHONPATH=${site:+$site:}$PYTHONPATH until_oom "$impl" "$(sizes 64k 1k)" 30 --semantics head_groups \
      --mode "$(sizes fwdbwd fwd)" --out "$RESULTS/peers_head_groups_$impl.jsonl" 2>&1 \
      | tee -a "$RESULTS/peers_head_groups.log" | tail -3
  done
  true
}

# --- 5: CUDA verify of the features, each block kernel forced in turn -----------------------------------------
SINGLE="--impl DilatedAttention --impl ImprovedDilatedAttention --impl MultiheadDilatedAttention --impl ImprovedMultiheadDilatedAttention"
verify_kernel() {   # verify_kernel KERNEL: the single-device classes (the engine's block kernel) forced to KERNEL
  for dtype in $(sizes "bfloat16 float16" float32); do
    DATTN_BLOCK_KERNEL=$1 dattn verify --device "$DEVICE" --quick --world-size 1 --dtype "$dtype" $SINGLE \
      --json "$RESULTS/verify_${1}_$dtype.json" --junit "$RESULTS/verify_${1}_$dtype.xml" || return 1
  done
}
verify_quick_all() {   # `dattn verify --device cuda --quick` as a user runs it: every default implementation
  for dtype in $(sizes "bfloat16 float16" float32); do
    dattn verify --device "$DEVICE" --quick --dtype "$dtype" --json "$RESULTS/verify_quick_$dtype.json" || return 1
  done
}
verify_cudnn() { verify_kernel cudnn; }
verify_fa2() { verify_kernel fa2; }
verify_fa4() { verify_kernel fa4; }
verify_features() {   # GQA, packed documents, the sliding window, block-sparse on FlexAttention (compiles: long cap)
  local v="dattn verify --device $DEVICE --quick --dtype $DTYPE --world-size 1 $SHAPE --seq-len $(sizes 8192 1024)"
  $v --kv-heads 2 --impl ImprovedDilatedAttention --impl DilatedAttention --json "$RESULTS/verify_gqa.json" || return 1
  $v --documents "$(sizes 3000,5192 300,724)" --impl ImprovedDilatedAttention --json "$RESULTS/verify_documents.json" \
    || return 1
  local b="dattn verify --device $DEVICE --quick --dtype $DTYPE --world-size 1 --seq-len $(sizes 8192 1024)"
  $b --impl BlockSparseRingDilatedAttention --pattern sliding_window --window-left "$(sizes 512 64)" \
    --json "$RESULTS/verify_window.json" || return 1
  $b --impl BlockSparseRingDilatedAttention --impl BlockSparseRingMultiheadDilatedAttention \
    --json "$RESULTS/verify_flex.json"
}
compiled_op() {   # the compiled custom op measured on the device (torch.compile of the single-device call)
  dattn bench --device "$DEVICE" --dtype "$DTYPE" --mode fwdbwd $SHAPE --impl ImprovedDilatedAttention --compile \
    --seq-len "$(sizes 64k 4k)" --repeat 3 --warmup 2 $(memory_cap) --out "$RESULTS/bench_compiled.jsonl"
}
verify_1m() {   # issue 32 item 6: both single-device classes at 1M against a float64 reference computed on the device
  dattn verify --device "$DEVICE" --impl ImprovedDilatedAttention --impl DilatedAttention --seq-len "$(sizes 1m 4k)" \
    --dtype "$DTYPE" $SHAPE --json "$RESULTS/verify_1m.json"
}

export -f $(declare -F | awk '{print $3}'); export RESULTS DEVICE BIG DTYPE SHAPE SITE STEP_CAP SINGLE
RANK1="env_info:30 tests_cuda:240 dense_blocks_1m:240"
RANK2="oom_improved:300 plan_check:60"
RANK3="fa4_stage_a:30 fa4_install:120 fa4_rows:300"
RANK4="peers_dense:300 peers_flex:300 peers_head_groups:300"
RANK5="verify_cudnn:300 verify_fa2:300 verify_fa4:300 verify_features:300 compiled_op:180 verify_1m:300 dense_blocks_more:300 verify_quick_all:300"
ALL="$RANK1 $RANK2 $RANK3 $RANK4 $RANK5"
for item in ${*:-$ALL}; do
  name=${item%%:*}; cap=${item##*:}; [ "$cap" = "$name" ] && cap=$STEP_CAP
  step "$name" "$cap" "$name"
done
echo "== all steps tried at ${SECONDS}s; results in $RESULTS" | tee -a "$LOG"
pack
