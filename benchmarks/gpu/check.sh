#!/usr/bin/env bash
# The project's check on one CUDA GPU, in one short run: the CUDA-only tests, then the figures
# the GPU goals are stated in (benchmarks/gpu/README.md), printed at the end as one table by
# benchmarks/gpu/summary.py against each goal:
#   tests     pytest tests/gpu (skipped without a GPU elsewhere; here they must pass)
#   demo      configs/demo.yaml, its 1,500 updates on the GPU: training minutes; test BLEU, beam 4
#   evaluate  evaluate --split test_2016_flickr (beam 4) at the default precision and in fp32: seconds
#   profile   benchmarks/decode/step_profile.py: a decoding step in fp32 and bf16, greedy and beam 4, with
#             each attention backend alone (device ms, host reads, kernels): where bf16 decoding's time goes
#   base      benchmarks/gpu_base.py at the paper's batch (1,000 x 25 tokens a side, 37k vocabulary):
#             MFU against the matmul rate measured in the same run, and torch.nn.Transformer's tokens/s
#   lm        the language model against nanoGPT's own train.py on its GPU Shakespeare recipe
#             (configs/shakespeare-char-gpu.yaml), equal updates, eager and both compiled
#   full      configs/shakespeare-char-gpu.yaml as shipped (5,000 updates): exact validation loss
#   seed      benchmarks/seed_claims/run.py part 1 on the GPU: RNN against Transformer tokens/s
#   compile   (not in the default STEPS) gpu_base.py's base model with its training graph compiled at
#             one shape against eager: whether bucketing translation batches for torch.compile can pay
# STEPS picks some (default: all but compile, in that order); about 8 minutes on an H200.
#
# S (required) names a folder holding data/ (multi30k/ and tinyshakespeare/, as TRANSFORMER_DATA
# holds them) and peers/nanoGPT/ (nanoGPT's own checkout). For a remote GPU machine that gets
# only the checkout, copy them into an ignored folder of it and carry that:
#   echo /.device-carry/ >> .git/info/exclude
#   mkdir -p .device-carry/peers && cp -r DATA_DIR .device-carry/data && cp -r NANOGPT_DIR .device-carry/peers/nanoGPT
#   device run: S=.device-carry bash benchmarks/gpu/check.sh 2>&1 | tee $OUT/check.log   (carry: .device-carry)
# The device image has torch, pytest, sacrebleu, sentencepiece, safetensors and yaml; sacremoses
# is carried as a wheel in .whl (see the device tool's README) and installed here when present.
# DRY=1 runs every step on the CPU with tiny settings (a few minutes): try it there first.
[[ -n ${S:-} && -d $S/data ]] || { echo "check.sh: set S to a folder holding data/ and peers/nanoGPT/ (see the header)" >&2; exit 2; }
P=${P:-$PWD}; S=$(cd "$S" && pwd); W=$(mktemp -d); OUT=${OUT:-$W/out}; mkdir -p "$OUT"
STEPS=${STEPS:-"tests demo evaluate profile base lm full seed"}
DEV=cuda; T=1; LM_STEPS=${LM_STEPS:-1000}; DEMO=(); FULL=(); BASE=(--batch 1000 --length 25 --vocab 37000 --steps 40 --decode 0 --peer)
NG_TOKENS=16384; CTX=256; LOG=10; SEED=(--tokens 16384 --reps 2 --rounds 1)
PROFILE=(--batch 64 --steps 16 --sdpa default,cudnn,flash,efficient,math)
if [[ ${DRY:-0} == 1 ]]; then
  DEV=cpu; T=4; LM_STEPS=4; NG_TOKENS=128; CTX=32; LOG=1
  DEMO=(--set max_steps=4 --set vocab_size=1000 --set eval_every=4 --set save_every=4)
  FULL=(--set max_steps=4 --set lr_decay_steps=4 --set eval_every=4 --set save_every=4)
  BASE=(--device cpu --batch 8 --length 8 --vocab 1000 --steps 2 --decode 0 --precision fp32 --peer)
  SEED=(--tokens 64 --lengths 8,16 --reps 1 --rounds 1)
  PROFILE=(--batch 4 --steps 4 --sdpa default,math)
fi
SMALL_LM=(); SMALL_NG=()  # DRY: nanoGPT's recipe shrunk to seconds on a CPU, both sides alike
[[ $DEV == cpu ]] && SMALL_LM=(--set model.d_model=64 --set model.n_heads=2 --set model.d_ff=256 --set model.n_layers=2
  --set model.max_len=32 --set batch_size=4 --set precision=fp32) \
  && SMALL_NG=(--device=cpu --dtype=float32 --n_layer=2 --n_embd=64 --n_head=2 --block_size=32 --batch_size=4)
if [[ -d $P/.whl ]]; then python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $W/site $P/.whl/*.whl; fi
export PYTHONPATH=$P/src:$P/tests:$W/site TRANSFORMER_DATA=$S/data PYTHONUNBUFFERED=1 HOME=$W/home
PY=${PY:-python3}
log() { echo "=== $(date +%T) $*"; }
want() { [[ " $STEPS " == *" $1 "* ]]; }
secs() { $PY -c "import time; print(f'{time.time():.2f}')"; }
cd "$P"

log "env ($DEV)"
nvidia-smi -L 2>/dev/null
$PY -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.is_available() and torch.cuda.get_device_name())"
$PY -c "from transformer import hardware; print(hardware.describe_line())"

if want tests; then
  log "tests: pytest tests/gpu"
  timeout $((300*T)) $PY -m pytest -q -p no:cacheprovider -rs tests/gpu > "$OUT/pytest.log" 2>&1
  rc=$?; tail -5 "$OUT/pytest.log"; echo "pytest rc=$rc"
fi

if want demo || want evaluate; then
  log "demo: configs/demo.yaml on $DEV"
  t0=$(secs)
  timeout $((300*T)) $PY -m transformer train --config configs/demo.yaml --out $W/demo --device $DEV \
    --set progress=false "${DEMO[@]}" > "$OUT/demo_train.log" 2>&1
  echo "train rc=$? in $($PY -c "print(round($(secs) - $t0))") s wall"; tail -2 "$OUT/demo_train.log"
  cp $W/demo/metrics.jsonl "$OUT/demo_metrics.jsonl" 2>/dev/null
fi

if want evaluate && [[ -d $W/demo ]]; then
  for prec in default fp32; do
    log "evaluate: test_2016_flickr, beam 4, precision $prec"
    extra=(); [[ $prec == fp32 ]] && extra=(--precision fp32)
    t0=$(secs)
    timeout $((120*T)) $PY -m transformer evaluate --model $W/demo --split test_2016_flickr --beam 4 --device $DEV \
      "${extra[@]}" --json > "$OUT/eval_$prec.json" 2> "$OUT/eval_$prec.err"
    echo "rc=$?"; $PY -c "print(round($(secs) - $t0, 2))" > "$OUT/eval_$prec.wall"
    cat "$OUT/eval_$prec.json"; echo " wall $(cat $OUT/eval_$prec.wall) s"; tail -2 "$OUT/eval_$prec.err"
  done
fi

if want profile; then
  log "profile: a decoding step, fp32 and bf16, each attention backend alone"
  timeout $((180*T)) $PY benchmarks/decode/step_profile.py --device $DEV "${PROFILE[@]}" > "$OUT/step_profile.txt" 2>&1
  echo "rc=$?"; grep -E "^\| |with .* attention:" "$OUT/step_profile.txt"
fi

if want base; then
  log "base: gpu_base.py ${BASE[*]}"
  timeout $((240*T)) $PY benchmarks/gpu_base.py "${BASE[@]}" --json "$OUT/gpu_base.json" 2>&1 | tail -24
fi

ours_lm() {  # ours_lm NAME EXTRA...: the GPU recipe for $LM_STEPS updates
  local name=$1; shift
  timeout $((240*T)) $PY -m transformer train --config configs/shakespeare-char-gpu.yaml --out $W/$name --device $DEV \
    --set max_steps=$LM_STEPS --set lr_decay_steps=$LM_STEPS --set eval_every=$LM_STEPS --set save_every=$LM_STEPS \
    --set log_every=$LOG --set progress=false "${SMALL_LM[@]}" "$@" > "$OUT/$name.log" 2>&1
  echo "ours $name rc=$?"; tail -1 "$OUT/$name.log"; cp $W/$name/metrics.jsonl "$OUT/$name.jsonl" 2>/dev/null
}
nanogpt() {  # nanogpt NAME COMPILE: nanoGPT's own train.py on its own config, $LM_STEPS updates
  (cd $W/ng && timeout $((240*T)) $PY train.py config/train_shakespeare_char.py "${SMALL_NG[@]}" --compile=$2 \
    --max_iters=$LM_STEPS --lr_decay_iters=$LM_STEPS --eval_interval=$LM_STEPS --eval_iters=100 --log_interval=$LOG \
    --out_dir=$W/$1 > "$OUT/$1.log" 2>&1)
  echo "nanoGPT $1 rc=$?"; grep -E "step [0-9]+: train loss" "$OUT/$1.log" | tail -1
  timeout 120 $PY - "$W/$1/ckpt.pt" "$DEV" > "$OUT/$1.val" <<EOF
import sys; from pathlib import Path
sys.path.insert(0, "$P/benchmarks/lm")
from nanogpt import peer_exact_val
print(peer_exact_val(Path("$W/ng"), Path(sys.argv[1]), Path("$S/data/tinyshakespeare/input.txt"), $CTX, sys.argv[2]))
EOF
  echo "nanoGPT $1 exact validation loss (our windows): $(cat $OUT/$1.val)"
}
if want lm; then
  log "lm: ours against nanoGPT, $LM_STEPS updates each, eager then both compiled"
  rm -rf $W/ng && cp -r "$S/peers/nanoGPT" $W/ng && cp "$S/data/tinyshakespeare/input.txt" $W/ng/data/shakespeare_char/
  mkdir -p $W/stub && echo "def get(url): raise RuntimeError('no network')" > $W/stub/requests.py
  (cd $W/ng/data/shakespeare_char && PYTHONPATH=$W/stub $PY prepare.py > /dev/null)
  ours_lm lm_eager; nanogpt ng_eager False
  ours_lm lm_compiled --set compile=true; nanogpt ng_compiled True
fi

if want full; then
  log "full: configs/shakespeare-char-gpu.yaml as shipped"
  timeout $((420*T)) $PY -m transformer train --config configs/shakespeare-char-gpu.yaml --out $W/full --device $DEV \
    --set progress=false "${SMALL_LM[@]}" "${FULL[@]}" > "$OUT/lm_full.log" 2>&1
  echo "rc=$?"; tail -1 "$OUT/lm_full.log"; cp $W/full/metrics.jsonl "$OUT/lm_full.jsonl" 2>/dev/null
fi

if want compile; then
  log "compile: the base model's training graph compiled at one shape, against eager"
  timeout $((300*T)) $PY benchmarks/gpu_base.py "${BASE[@]}" --compile --json "$OUT/gpu_base_compile.json" 2>&1 | tail -6
fi

if want seed; then
  log "seed: RNN against Transformer training tokens/s on $DEV"
  timeout $((150*T)) $PY benchmarks/seed_claims/run.py --parts 1 --device $DEV "${SEED[@]}" --out $W/seed 2>&1 | tail -20
  cp $W/seed/results.json "$OUT/seed_claims.json" 2>/dev/null
fi

log "summary"
$PY benchmarks/gpu/summary.py "$OUT" --tokens-per-update $NG_TOKENS
log done
