#!/usr/bin/env bash
# One device-machine call: CUDA correctness tests, then the layer/model measurements on the GPU.
#   bash benchmarks/gpu_run.sh <stage> [layer_claims options...]     (results under $OUT, default ./gpu_out)
# stage: tests | model | block | attention. Carried wheels in .whl/ (pydantic, where the image lacks it) are installed first.
set -u
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
dattn() { python3 -c 'import sys; from dattn_cli.cli import main; sys.argv[0] = "dattn"; main()' "$@"; }
stage=$1; shift
case $stage in
  env)  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
        python3 -c 'import torch; print(torch.__version__, torch.cuda.get_device_name(), torch.cuda.mem_get_info())' ;;
  tests) python3 -m pytest -q -p no:cacheprovider tests/kernels/test_cuda.py "$@" 2>&1 | tee "$OUT/pytest_cuda.log" ;;
  model) python3 benchmarks/layer_claims.py --device cuda --skip-block --model-out "$OUT/model_until_oom_cuda.jsonl" "$@" 2>&1 | tee -a "$OUT/model.log" ;;
  block) python3 benchmarks/layer_claims.py --device cuda --skip-model --block-out "$OUT/layer_cuda.jsonl" "$@" 2>&1 | tee -a "$OUT/block.log" ;;
  attention) dattn bench --device cuda --dtype bfloat16 --mode fwdbwd --causal --impl ImprovedDilatedAttention --impl sdpa \
        --until-oom --start-seq-len 16k --segments 2048,4096,8192,16384,32768 --dilations 1,2,4,8,16 --out "$OUT/attention_until_oom_cuda.jsonl" "$@" 2>&1 | tee -a "$OUT/attention.log" ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
