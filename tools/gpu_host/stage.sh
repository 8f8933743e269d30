#!/bin/bash
# On the GPU machine, each call: keep the carried parts (.gpu/c*) and wheels outside the
# working tree, which the next call replaces.
mkdir -p /root/stage && cp -r .gpu/c* /root/stage/ 2>/dev/null
[ -d .gpu/wheels ] && cp -r .gpu/wheels /root/stage/
ls /root/stage
