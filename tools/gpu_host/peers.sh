#!/bin/bash
# On the GPU machine, in the first call (after stage.sh has kept the wheels): the reference's
# site, and its runs of benchmarks/gpu.py started in their own process session, so that they
# outlive the call and measure while the TensorFlow parts are being sent (the GPU is idle
# then). setup.sh waits for them before it unpacks TensorFlow (no contention for the CPU).
# Options by environment: PEER_PREC, PEER_FW, PEER_ROUNDS. Results: /root/stage/peer.jsonl
# (one line per run, for `gpu.py --merge`) and peer.err (the table).
S=/root/stage
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-peer \
    $S/wheels/peer/*.whl || exit 1
printf '#!/bin/bash\nexport PYTHONPATH=/tmp/site-peer USE_TF=0 USE_TORCH=1\nexec python3 "$@"\n' \
    > /tmp/peerpy
chmod +x /tmp/peerpy
# A copy of what the runs read: the next call replaces the working tree.
rm -rf /root/peer && mkdir -p /root/peer && cp -r benchmarks keras_txl /root/peer/
cd /root/peer || exit 1
setsid nohup python3 benchmarks/gpu.py --peer-python /tmp/peerpy \
    --frameworks "${PEER_FW:-torch-eager,torch-compiled}" --precision "${PEER_PREC:-float32}" \
    --rounds "${PEER_ROUNDS:-1}" > $S/peer.jsonl 2> $S/peer.err < /dev/null &
echo $! > $S/peer.pid
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
grep -m1 'model name' /proc/cpuinfo; nproc
