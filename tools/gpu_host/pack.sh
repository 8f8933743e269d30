#!/bin/bash
# Builds, on a host with pip access, what runs keras-txl on a bare GPU machine that has a CUDA
# 13 PyTorch but no TensorFlow and no network (this project's lent GPU machines), in parts
# small enough to send one per call: see README.md beside this file.
#   tools/gpu_host/pack.sh OUT_DIR [PART_BYTES]
set -euo pipefail
out=${1:?OUT_DIR}; part=${2:-60000000}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out/wheels/tf" "$out/wheels/peer" "$out/build"
P="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp -q
   --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
   --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
   --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64"
python3 -m pip download $P -d "$out/build" tensorflow==2.21.0
python3 -m pip download $P -d "$out/wheels/tf" keras==3.15.1 keras-hub==0.32.0 namex==0.1.0 \
    optree==0.20.0 gast==0.7.0 astunparse==1.6.3 google-pasta==0.2.0 termcolor==3.3.0 \
    protobuf==7.36.2 ml_dtypes==0.6.0 wrapt==2.5.2 flatbuffers==25.12.19 numpy==2.4.6 \
    nvidia-cuda-runtime-cu12==12.9.79
python3 -m pip download $P -d "$out/wheels/peer" transformers==4.37.2 tokenizers==0.15.2 \
    huggingface-hub==0.26.5
# TensorFlow less its C++ headers and its profiler plug-in (1.3 GB unpacked, 295 MB as xz).
rm -rf "$out/build/x"; mkdir -p "$out/build/x"
(cd "$out/build/x" && unzip -q ../tensorflow-2.21.0-*.whl \
   && rm -rf tensorflow/include tensorflow/python/profiler/internal/_pywrap_profiler_plugin.so \
   && tar cf - tensorflow tensorflow-2.21.0.dist-info | xz -T0 -6 > ../tf.tar.xz)
sha256sum "$out/build/tf.tar.xz" | cut -d' ' -f1 > "$out/tf.sha256"
split -b "$part" -d -a 2 "$out/build/tf.tar.xz" "$out/build/part."
i=0
for f in "$out"/build/part.*; do i=$((i + 1)); mkdir -p "$out/c$i"; mv "$f" "$out/c$i/"; done
cp "$here"/*.sh "$here"/*.py "$out/"
echo "parts: $i ($out/c1 .. $out/c$i), wheels: $out/wheels"
