#!/usr/bin/env bash
# Issue 21 on one GPU machine, in one device call of at most ~10 minutes (resumable: a rerun skips the steps
# already done in $RESULTS and bench --resume keeps the points already measured).
#
#   bash benchmarks/gpu_run.sh [STEP...]      (default: every step, in the order below, within $DEADLINE s)
#
# Every report goes to $RESULTS (default /tmp/gpu_results); after each step the folder is packed into
# $OUT/gpu_results.tgz (the device tool brings back at most 8 files) and the log copied to $OUT/gpu_run.log.
# Carried wheels in .whl/ (pydantic, which the image lacks) are installed first. DEVICE=cpu runs the same
# steps with tiny sizes, to check the script itself on a machine without a GPU.
set -u
OUT=${OUT:-gpu_out}; RESULTS=${RESULTS:-/tmp/gpu_results}; DEADLINE=${DEADLINE:-560}; DEVICE=${DEVICE:-cuda}
mkdir -p "$OUT" "$RESULTS"
LOG=$RESULTS/gpu_run.log
if ! python3 -c "import pydantic" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
dattn() { python3 -m dattn_cli "$@"; }
pack() { cp "$LOG" "$OUT/gpu_run.log"; tar czf "$OUT/gpu_results.tgz" -C "$RESULTS" . ; }

# step NAME CAP CMD...: run CMD (a function below) with at most CAP seconds and what is left before DEADLINE.
step() {
  local name=$1 cap=$2; shift 2
  if [ -e "$RESULTS/done.$name" ]; then echo "== $name: done before, skipped" | tee -a "$LOG"; return; fi
  local left=$((DEADLINE - SECONDS))
  if [ "$left" -lt 15 ]; then echo "== $name: not started, ${left}s left" | tee -a "$LOG"; return; fi
  [ "$cap" -gt "$left" ] && cap=$left
  echo "== $name (cap ${cap}s, at ${SECONDS}s)" | tee -a "$LOG"
  timeout -k 5 "$cap" bash -c "$*" >>"$LOG" 2>&1
  local rc=$?
  echo "== $name: rc=$rc at ${SECONDS}s" | tee -a "$LOG"
  [ "$rc" -eq 0 ] && touch "$RESULTS/done.$name"
  pack
}

if [ "$DEVICE" = cuda ]; then BIG=1; else BIG=0; fi
sizes() { [ "$BIG" = 1 ] && echo "$1" || echo "$2"; }   # sizes GPU CPU-check

env_info() {
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv 2>&1 || true
  python3 -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available() and torch.cuda.get_device_name())'
  python3 -m pip list 2>/dev/null | grep -i -E "^(torch|triton|flash|pydantic|typer|rich|scipy|nvidia-ml-py) " || true
  dattn env --json "$RESULTS/env.json"
}
flash_probe() {   # does aten's FlashAttention-2 op give (out, lse) whose backward takes a merged lse? (a faster block backend)
  python3 - <<'EOF'
import torch, torch.nn.functional as F
q, k, v, g = (torch.randn(4, 8, 1024, 64, device="cuda", dtype=torch.bfloat16) for _ in range(4))
r = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False, False, scale=0.125)
print("flash fwd outputs:", [type(x).__name__ + (str(tuple(x.shape)) if hasattr(x, "shape") else f"={x}") for x in r])
out, lse = r[0], r[1]
dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_backward(g, q, k, v, out, lse, r[2], r[3], r[4], r[5], 0.0, False, r[6], r[7], scale=0.125)
qs, ks, vs = (x.clone().requires_grad_() for x in (q, k, v))
ref = F.scaled_dot_product_attention(qs, ks, vs, scale=0.125)
rq, rk, rv = torch.autograd.grad(ref, (qs, ks, vs), g)
print("flash op max |diff| out", (out - ref).abs().max().item(), "dq", (dq - rq).abs().max().item(), "dv", (dv - rv).abs().max().item())
# the memory-efficient backward given `out` as a (b, h, m, D)-contiguous tensor (as gathered blocks were) vs (b, m, h, D)
o, l = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, False, scale=0.125)[:2]
z = torch.zeros((), dtype=torch.int64, device="cuda")
for name, oo in (("out (b,m,h,D)-contiguous", o.transpose(1, 2).contiguous().transpose(1, 2)), ("out (b,h,m,D)-contiguous", o.contiguous())):
    gq = torch.ops.aten._scaled_dot_product_efficient_attention_backward(g, q, k, v, None, oo, l, z, z, 0.0, [True, True, True, False], False, scale=0.125)[0]
    print("efficient bwd,", name, ": max |dq - ref|", (gq - rq).abs().max().item())
EOF
}
tests_cuda() {
  python3 -m pytest -q -p no:cacheprovider tests/kernels/test_cuda.py -k "sdpa or flash_cuda" tests/runtime/test_gpustate.py \
    tests/verify/test_distributed.py --junitxml "$RESULTS/pytest_cuda.xml"
}
tests_flex() { python3 -m pytest -q -p no:cacheprovider tests/kernels/test_cuda.py -k flex --junitxml "$RESULTS/pytest_flex.xml"; }
verify_cuda() {   # the single-device classes (block-sparse compiles FlexAttention per shape: verify_flex)
  for dtype in bfloat16 float16; do
    dattn verify --device "$DEVICE" --quick --world-size 1 --dtype $dtype --impl DilatedAttention --impl ImprovedDilatedAttention \
      --impl MultiheadDilatedAttention --impl ImprovedMultiheadDilatedAttention --json "$RESULTS/verify_cuda_$dtype.json" \
      --junit "$RESULTS/verify_cuda_$dtype.xml" || return 1
  done
}
verify_flex() {
  dattn verify --device "$DEVICE" --quick --world-size 1 --dtype bfloat16 --impl BlockSparseRingDilatedAttention \
    --impl BlockSparseRingMultiheadDilatedAttention --json "$RESULTS/verify_flex.json" --junit "$RESULTS/verify_flex.xml"
}
verify_nccl() {   # the distributed classes in a process group of one (NCCL on CUDA)
  dattn verify --device "$DEVICE" --quick --world-size 1 --dtype bfloat16 --impl RingDilatedAttention \
    --impl DistributedImprovedDilatedAttention --impl HeadParallelDilatedAttention --impl RingMultiheadDilatedAttention \
    --impl DistributedImprovedMultiheadDilatedAttention --impl HeadParallelMultiheadDilatedAttention \
    --json "$RESULTS/verify_nccl_ws1.json" || return 1
  torchrun --standalone --nproc-per-node 1 -m dattn_cli verify --device "$DEVICE" --quick --dtype bfloat16 \
    --impl RingDilatedAttention --impl DistributedImprovedDilatedAttention --json "$RESULTS/verify_torchrun.json" || return 1
  torchrun --standalone --nproc-per-node 1 -m dattn_cli bench --device "$DEVICE" --dtype bfloat16 --impl RingDilatedAttention \
    --seq-len "$(sizes 65536 4096)" --repeat 5 --warmup 2 --out "$RESULTS/bench_torchrun.jsonl"
}
until_oom() {   # until_oom IMPL START MAX_SECONDS
  dattn bench --device "$DEVICE" --dtype "$(sizes bfloat16 float32)" --mode fwdbwd --batch 1 --heads 8 --head-dim 64 \
    --segments 2048,4096,8192 --dilations 1,2,4 --impl "$1" --until-oom --start-seq-len "$2" --repeat 3 --warmup 1 \
    --max-seconds "$3" $( [ "$BIG" = 1 ] || echo --max-memory 1GiB ) --resume --out "$RESULTS/until_oom_$1.jsonl"
}
oom_improved() { until_oom ImprovedDilatedAttention "$(sizes 1m 64k)" 30; }
oom_dilated() { until_oom DilatedAttention "$(sizes 1m 64k)" 30; }
oom_sdpa() { until_oom sdpa "$(sizes 64k 4k)" 8; }
dense_blocks() {
  python3 benchmarks/dense_blocks.py --device "$DEVICE" --dtype "$(sizes bfloat16 float32)" --mode fwdbwd \
    --seq-len "$(sizes 64k,1m,2m 16k)" --trace "$RESULTS" --out "$RESULTS/dense_blocks.jsonl"
}
standard_shape() {   # 16k tokens per batch, hidden 2048 (the FlashAttention papers' figures): batch = 16k/N, heads = 2048/d
  local total=$(sizes 16384 1024) hidden=$(sizes 2048 256)
  for causal in --no-causal --causal; do for d in 128 64; do for n in $(sizes "512 1024 2048 4096 8192 16384" "256 512"); do
    for mode in fwdbwd fwd; do
      dattn bench --device "$DEVICE" --impl sdpa --dtype "$(sizes bfloat16 float32)" --mode $mode $causal --seq-len $n \
        --batch $((total / n)) --heads $((hidden / d)) --head-dim $d --repeat 10 --warmup 3 -q --resume \
        --out "$RESULTS/standard_shape.jsonl" >/dev/null || return 1
    done; done; done; done
}
profile_cuda() {
  dattn profile --device "$DEVICE" --dtype "$(sizes bfloat16 float32)" --seq-len "$(sizes 65536 4096)" --iterations 10 \
    --json "$RESULTS/profile_cuda.json"
}

export -f $(declare -F | awk '{print $3}'); export RESULTS DEVICE BIG
ALL="env_info:30 flash_probe:20 tests_cuda:80 verify_cuda:60 oom_improved:130 dense_blocks:40 standard_shape:80 oom_sdpa:35 oom_dilated:45 verify_nccl:45 profile_cuda:25 tests_flex:120 verify_flex:120"
[ "$DEVICE" = cuda ] || ALL=${ALL/flash_probe:20 /}
for item in ${*:-$ALL}; do
  name=${item%%:*}; cap=${item##*:}; [ "$cap" = "$name" ] && cap=120
  step "$name" "$cap" "$name"
done
echo "== all steps tried at ${SECONDS}s; results in $RESULTS" | tee -a "$LOG"
pack
