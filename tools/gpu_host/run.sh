#!/bin/bash
# On the GPU machine after setup.sh: the GPU tests, then the benchmark (ours and the
# reference), results under $OUT. Options by environment: PREC, FW, ROUNDS, TEST_T, BENCH_T.
. /tmp/env.sh
ln -sfn ../training keras_txl/training; ln -sfn ../export keras_txl/export
NVIDIA_TF32_OVERRIDE=0 timeout ${TEST_T:-300} python3 -m pytest -q -p no:cacheprovider \
    tests/test_gpu.py tests/test_hf_parity.py > $OUT/pytest_gpu.txt 2>&1; tail -5 $OUT/pytest_gpu.txt
timeout ${BENCH_T:-400} python3 benchmarks/gpu.py --peer-python /tmp/peerpy \
    --precision ${PREC:-mixed_bfloat16,float32} --frameworks ${FW:-keras-xla,torch-eager,torch-compiled} \
    --rounds ${ROUNDS:-1} > $OUT/runs.jsonl 2> $OUT/runs.err; tail -25 $OUT/runs.err
