#!/bin/bash
# On the GPU machine, once every part is staged: TensorFlow and its Python dependencies in
# /tmp/site-tf, the reference's in /tmp/site-peer, CUDA library names (cudalibs.py), a probe.
S=/root/stage
# The reference's runs (peers.sh), if started, finish first: no contention for the CPU.
while [ -f $S/peer.pid ] && kill -0 "$(cat $S/peer.pid)" 2>/dev/null; do sleep 2; done
cat $(ls $S/c*/part.* | sort) > /tmp/tf.tar.xz
echo "$(sha256sum /tmp/tf.tar.xz | cut -d' ' -f1) (expected $(cat .gpu/tf.sha256))"
mkdir -p /tmp/site-tf && xz -T0 -dc /tmp/tf.tar.xz | tar x -C /tmp/site-tf && rm /tmp/tf.tar.xz
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-tf $S/wheels/tf/*.whl
[ -d /tmp/site-peer ] || python3 -m pip install -q --no-index --no-deps --no-compile \
    --target /tmp/site-peer $S/wheels/peer/*.whl
# `import tensorflow` imports the profiler plug-in left out; the tokenizers import
# tensorflow-text (not needed by the benchmark or tests/test_gpu.py).
touch /tmp/site-tf/tensorflow/python/profiler/internal/_pywrap_profiler_plugin.py
mkdir -p /tmp/site-tf/tensorflow_text && touch /tmp/site-tf/tensorflow_text/__init__.py
python3 .gpu/cudalibs.py /opt /usr/local /usr/lib/x86_64-linux-gnu
PX=$(ls /usr/local/cuda*/bin/ptxas | head -1); CUDA=$(dirname "$(dirname "$(readlink -f "$PX")")")
cat > /tmp/env.sh <<E
export LD_LIBRARY_PATH=/tmp/site-tf/nvidia/cuda_runtime/lib:/tmp/cudalibs:$(cat /tmp/cudalibs/dirs):\$LD_LIBRARY_PATH
export PATH=$CUDA/bin:\$PATH XLA_FLAGS=--xla_gpu_cuda_data_dir=$CUDA PYTHONPATH=/tmp/site-tf KERAS_BACKEND=tensorflow
E
printf '#!/bin/bash\nexport PYTHONPATH=/tmp/site-peer USE_TF=0 USE_TORCH=1\nexec python3 "$@"\n' > /tmp/peerpy
chmod +x /tmp/peerpy
ln -sfn ../training keras_txl/training; ln -sfn ../export keras_txl/export
. /tmp/env.sh && TF_CPP_MIN_LOG_LEVEL=1 timeout 150 python3 .gpu/probe.py
