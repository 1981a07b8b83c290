# The open device runs, one step per call (each within the 10-minute limit), after stage.sh:
#   bash lab/tools/device/runs.sh STEP [LIMIT_S]
# STEP (results under $OUT, logs beside them):
#   tile96        the hd192 backward on 96-key tiles (kernel-sm90-backward/tile96-hd192.diff): main's
#                 package kept for the A/B, the diff applied, the head dim's GPU tests, the settled A/B
#   fwd           the forward grid, then the ten shapes, settled, beside FA3, flash-attn-4 and cuDNN
#                 (FA3 needs .fa3/ carried in this call or an earlier one on the same machine)
#   decode-varlen the decode grid with CUDA graphs, then the nine varlen batches with their dense twins
#   bwd           the backward grid and its seven further problems, beside flash-attn-4 and cuDNN
#   noadds        what dQ's adds cost (kernel-sm90-backward/no-adds.diff): default, red and the build
#                 without the adds at hd64 / 128 / 256, 4k and 16k, settled
# Each step sources setup.sh (the bundle's second half, the install) and stops its last command
# at LIMIT_S (default 585) seconds from its start.
set -u
STEP=${1:-}  # one of the steps above
case "$STEP" in tile96|fwd|decode-varlen|bwd|noadds) ;;
  *) echo "runs.sh: step '$STEP' unknown; allowed: tile96, fwd, decode-varlen, bwd, noadds" >&2; exit 2 ;;
esac
T0=$(date +%s); LIMIT=${2:-585}
source lab/tools/device/setup.sh
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv > $OUT/device.txt
at() { echo "$1 rc=$2 at $(( $(date +%s) - T0 ))s"; }
case "$STEP" in
  tile96)
    D=lab/campaigns/kernel-sm90-backward/tile96-hd192.diff
    mkdir -p /tmp/main && cp -r fa4kernel /tmp/main/
    (git apply "$D" 2>/dev/null || patch -p1 -s < "$D") && echo "applied $D"
    timeout 300 python3 -m pytest -q -p no:cacheprovider -o addopts="" -m gpu tests/test_kernel_sm90_bwd_gpu.py \
      tests/test_varlen_gpu.py tests/test_torch_op_gpu.py -k 192 > $OUT/tile96_tests.log 2>&1
    at tests $?; tail -3 $OUT/tile96_tests.log
    timeout $(left $LIMIT) python3 lab/tools/bench_bwd_sm90.py --sustained --no-deterministic --skip fa2,sdpa-cudnn \
      --tree main=/tmp/main --problem b=2,h=10,s=5000,d=192,causal --problem b=3,h=12,s=7001,d=192 \
      --problem b=8,h=16,s=2048,d=192,causal --problem b=1,h=16,s=16384,d=192 --problem b=16,h=8,s=1024,d=192 \
      --problem b=2,h=32,kv=8,s=4096,d=192,causal --problem b=4,h=12,s=1537,d=192 \
      --out $OUT/tile96_ab.json > $OUT/tile96_ab.log 2>&1
    at ab $?; grep "^bwd\|geomean" $OUT/tile96_ab.log | tail -24 ;;
  fwd)
    timeout 340 python3 lab/tools/sustained_sm90.py --points grid --candidates ours,fa3,fa4,cudnn --budget-s 320 \
      --out $OUT/grid.json > $OUT/grid.log 2>&1
    at grid $?; tail -4 $OUT/grid.log
    timeout $(left $LIMIT) python3 lab/tools/sustained_sm90.py --problem b=3,h=16,sq=3001,d=128,causal \
      --problem b=2,h=24,sq=5003,d=64 --problem b=8,h=16,sq=2047,d=96 --problem b=3,h=16,sq=4500,d=192,causal \
      --problem b=2,h=32,kv=8,sq=4096,d=128,causal --problem b=1,h=64,kv=8,sq=8191,d=128 \
      --problem b=4,h=16,sq=1536,sk=9000,d=128,causal --problem b=1,h=16,sq=6000,d=256,causal \
      --problem b=8,h=32,kv=1,sq=2047,d=64,causal --problem b=2,h=12,sq=9999,d=192 \
      --candidates ours,fa3,fa4,cudnn --budget-s $(( $(left $LIMIT) - 30 )) --out $OUT/ten.json > $OUT/ten.log 2>&1
    at ten $?; tail -4 $OUT/ten.log ;;
  decode-varlen)
    timeout 300 python3 lab/tools/bench_decode_sm90.py --grid --splits= --graph --out $OUT/decode.json \
      > $OUT/decode.log 2>&1
    at decode $?; tail -4 $OUT/decode.log
    timeout $(left $LIMIT) python3 lab/tools/bench_varlen_sm90.py --dense-twin --batches ten-hd128-causal,gqa-hd128-causal,short-hd128-causal,hd256-causal,chunks-gqa-causal,mqa-hd128-causal,hd192-causal,odd-hd96,equal-hd128-causal \
      --out $OUT/varlen.json > $OUT/varlen.log 2>&1
    at varlen $?; tail -4 $OUT/varlen.log ;;
  bwd)
    timeout 240 python3 lab/tools/bench_bwd_sm90.py --skip fa2 --problem b=4,h=21,s=3001,d=96 \
      --problem b=2,h=10,s=5000,d=192,causal --problem b=3,h=12,s=7001,d=192 --problem b=32,h=16,s=512,d=128,causal \
      --problem b=16,h=32,s=333,d=64 --problem b=2,h=64,kv=8,s=4096,d=128,causal \
      --problem b=8,h=16,kv=1,s=2048,d=64,causal --out $OUT/bwd_new.json > $OUT/bwd_new.log 2>&1
    at new $?; tail -4 $OUT/bwd_new.log
    timeout $(left $LIMIT) python3 lab/tools/bench_bwd_sm90.py --skip fa2 --out $OUT/bwd_grid.json \
      > $OUT/bwd_grid.log 2>&1
    at grid $?; grep "^bwd\|geomean" $OUT/bwd_grid.log | tail -24 ;;
  noadds)
    D=lab/campaigns/kernel-sm90-backward/no-adds.diff
    (git apply "$D" 2>/dev/null || patch -p1 -s < "$D") && echo "applied $D"
    timeout $(left $LIMIT) python3 lab/tools/bench_bwd_sm90.py --sustained --no-deterministic --skip fa2,sdpa-cudnn \
      --hdims 64,128,256 --seqlens 4096,16384 --causal 0 --variants dq_reduce=red dq_reduce=none \
      --out $OUT/noadds.json > $OUT/noadds.log 2>&1
    at noadds $?; grep "^bwd\|geomean" $OUT/noadds.log | tail -12 ;;
esac
