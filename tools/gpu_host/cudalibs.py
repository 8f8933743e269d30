"""Make /tmp/cudalibs: TensorFlow 2.21's CUDA 12 sonames, served by this host's libraries.

TF 2.21 dlopens libcudart.so.12 (shipped: the real CUDA 12.9 runtime), libcublas(Lt).so.12,
libcufft.so.11, libcusolver.so.11, libcusparse.so.12, libcudnn.so.9, libnccl.so.2; the host
has PyTorch's CUDA 13 builds. TF resolves each function by name on first call, so the
CUDA 13 cuBLAS (every function TF's stubs name is exported) stands in for the 12 one.
"""
import glob
import os
import sys

dst = "/tmp/cudalibs"
os.makedirs(dst, exist_ok=True)
roots = sys.argv[1:] or ["/opt", "/usr/local", "/usr/lib"]
found = {}
for root in roots:
    for path in glob.glob(os.path.join(root, "**", "lib*.so*"), recursive=True):
        name = os.path.basename(path)
        found.setdefault(name, path)
want = {
    "libcublas.so.12": ["libcublas.so.12", "libcublas.so.13"],
    "libcublasLt.so.12": ["libcublasLt.so.12", "libcublasLt.so.13"],
    "libcufft.so.11": ["libcufft.so.11", "libcufft.so.12"],
    "libcusolver.so.11": ["libcusolver.so.11", "libcusolver.so.12"],
    "libcusparse.so.12": ["libcusparse.so.12", "libcusparse.so.13"],
    "libcudnn.so.9": ["libcudnn.so.9"],
    "libnccl.so.2": ["libnccl.so.2"],
    "libcupti.so.12": ["libcupti.so.12", "libcupti.so.13"],
}
dirs = []
for name, candidates in want.items():
    src = next((found[c] for c in candidates if c in found), None)
    print(name, "<-", src)
    if src:
        link = os.path.join(dst, name)
        if os.path.lexists(link):
            os.remove(link)
        os.symlink(os.path.realpath(src), link)
        d = os.path.dirname(os.path.realpath(src))
        if d not in dirs:
            dirs.append(d)
print("LIBDIRS=" + ":".join(dirs))
with open("/tmp/cudalibs/dirs", "w") as f:
    f.write(":".join(dirs))
