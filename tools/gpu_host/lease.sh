#!/bin/bash
# On the GPU machine, one call once the parts are staged (README.md, "The sixteenth session's
# lease"): setup, the GPU tests, ours in bf16 (XLA) and fp32 (XLA, graph), each phase under
# its own timeout (TEST_T, BF16_T, FP32_T). Results under $OUT: 8 files, as many as come back.
export PYTHONUNBUFFERED=1
t0=$(date +%s)
bash .gpu/setup.sh > $OUT/setup.txt 2>&1; tail -3 $OUT/setup.txt
echo "setup done at $(( $(date +%s) - t0 )) s"
cp /root/stage/peer.jsonl /root/stage/peer.err $OUT/ 2>/dev/null
tail -6 /root/stage/peer.err
. /tmp/env.sh; ln -sfn ../training keras_txl/training; ln -sfn ../export keras_txl/export
NVIDIA_TF32_OVERRIDE=0 timeout ${TEST_T:-150} python3 -m pytest -q -p no:cacheprovider \
    tests/test_gpu.py tests/test_hf_parity.py > $OUT/pytest_gpu.txt 2>&1; tail -6 $OUT/pytest_gpu.txt
echo "tests done at $(( $(date +%s) - t0 )) s"
timeout ${BF16_T:-150} python3 benchmarks/gpu.py --precision mixed_bfloat16 --frameworks keras-xla \
    --rounds 1 > $OUT/bf16.jsonl 2> $OUT/bf16.err; tail -8 $OUT/bf16.err
echo "bf16 done at $(( $(date +%s) - t0 )) s"
timeout ${FP32_T:-200} python3 benchmarks/gpu.py --precision float32 --frameworks keras-xla,keras \
    --rounds 1 > $OUT/fp32.jsonl 2> $OUT/fp32.err; tail -10 $OUT/fp32.err
echo "all done at $(( $(date +%s) - t0 )) s"
