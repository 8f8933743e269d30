"""Caps XLA's CPU kernels at the instruction set `ONEDNN_MAX_CPU_ISA` caps oneDNN's.

`ONEDNN_MAX_CPU_ISA=AVX2` lowers TensorFlow's graph-mode kernels (oneDNN's) but not an
XLA-compiled step's, which two other pieces produce:

- the fusions, compiled by LLVM for the CPU's own features unless XLA's flag
  `--xla_cpu_max_isa` says otherwise (it is read when XLA compiles for the first time);
- the dots, and some fusions, which TensorFlow 2.21's XLA hands to YNNPACK: it picks its
  kernels from the CPU's features (`ynn::get_supported_arch_flags()`, computed once) and
  reads no environment variable.

So on an AVX-512 host an "AVX2-capped" XLA step still ran AVX-512 matmuls: on the AMX
Xeon (eighteenth session) `perf` showed `ynn::dot_fp32_5x64x1_1x16x1_avx512f`, and the
feed-forward's (1024 x 256) x (256 x 1024) product ran at 154-162 GFLOP/s XLA-compiled under
the cap against 86-88 for oneDNN's AVX2 kernel (`attention_matmuls.py`); with this module's
cap XLA ran YNNPACK's `fma3` kernel, at 94-114. Every benchmark that compiles with XLA calls
`cap_xla_kernels()` right after importing TensorFlow, before anything is compiled, and
reports what it did in its JSON.

YNNPACK has no switch for this, so the cap writes its computed flags: the function's
static result is a local symbol of `libtensorflow_cc.so.2` (found with binutils' `nm`);
the function is called once through ctypes (so the static is initialised), its answer is
checked against /proc/cpuinfo (the low seven bits, SSE2 to FMA3, are the same in every
YNNPACK layout seen; a mismatch means another layout and nothing is written), and the
bits above the cap are cleared. Where any of this fails the benchmark still runs and its
JSON says the cap was not applied, and why. `BENCH_XLA_ISA_CAP=0` leaves XLA's kernels
uncapped (to reproduce the runs before this module). Benchmark-only: keras-txl itself never
does this.
"""

import ctypes
import os
import subprocess

# YNNPACK's x86 arch flags, lowest bits (ynnpack/base/arch.h): the same positions in
# every layout seen; everything from bit 7 up is AVX-512 or AMX.
YNN_BITS = (("sse2", 0), ("ssse3", 1), ("sse4_1", 2), ("avx", 3), ("f16c", 4),
            ("avx2", 5), ("fma", 6))
# oneDNN cap -> (XLA's --xla_cpu_max_isa, the YNNPACK bits kept).
CAPS = {
    "AVX2": ("AVX2", 0x7F),
    "AVX": ("AVX", 0x1F),
    "SSE41": ("SSE4_2", 0x07),
}
FUNCTION = "_ZN3ynn24get_supported_arch_flagsEv"
STATIC = "_ZZN3ynn24get_supported_arch_flagsEvE5flags"
LIBRARY = "libtensorflow_cc.so.2"

# What `cap_xla_kernels` did, for the benchmarks' JSON (`hostinfo.host_block`).
STATE = {"applied": False, "reason": "not called"}


def _cpu_flags():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def _library():
    """(load address, path) of the loaded `libtensorflow_cc.so.2`."""
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if (len(parts) >= 6 and parts[5].endswith(LIBRARY)
                    and int(parts[2], 16) == 0):
                return int(parts[0].split("-")[0], 16), parts[5]
    raise RuntimeError(f"{LIBRARY} is not loaded (import tensorflow first)")


def _symbols(path):
    # Read line by line: the whole listing is ~100 MB of text, which kept in this
    # process would raise the benchmark's own peak RSS by about as much.
    found = {}
    try:
        with subprocess.Popen(["nm", path], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True) as nm:
            for line in nm.stdout:
                parts = line.split()
                if len(parts) == 3 and parts[2] in (FUNCTION, STATIC):
                    found[parts[2]] = int(parts[0], 16)
        if nm.returncode:
            raise OSError(f"exit status {nm.returncode}")
    except OSError as e:
        raise RuntimeError(f"`nm {path}` failed ({e}); install binutils") from None
    missing = [name for name in (FUNCTION, STATIC) if name not in found]
    if missing:
        raise RuntimeError(f"{path} has no symbol {missing[0]} (another TensorFlow build)")
    return found


def cap_xla_kernels(environ=None):
    """Caps XLA's fusions and YNNPACK's kernels at the oneDNN cap in force.

    Call after `import tensorflow` and before anything is XLA-compiled. Returns (and
    keeps in `STATE`) a dict: `applied`, the cap, the XLA flag set, YNNPACK's flags
    before and after, or the reason nothing was done.
    """
    environ = os.environ if environ is None else environ
    cap = (environ.get("ONEDNN_MAX_CPU_ISA") or environ.get("DNNL_MAX_CPU_ISA") or "")
    cap = cap.upper()
    if cap in CAPS and environ.get("BENCH_XLA_ISA_CAP") == "0":
        # The behaviour before this module: oneDNN capped, XLA's kernels not.
        STATE.clear()
        STATE.update(applied=False, cap=cap, reason="turned off by BENCH_XLA_ISA_CAP=0")
        return dict(STATE)
    if cap not in CAPS:
        STATE.clear()
        STATE.update(applied=False, reason=f"no cap below AVX-512 (ONEDNN_MAX_CPU_ISA={cap or None})")
        return dict(STATE)
    xla_isa, keep = CAPS[cap]
    flag = f"--xla_cpu_max_isa={xla_isa}"
    flags = environ.get("XLA_FLAGS", "")
    if "--xla_cpu_max_isa" not in flags:
        environ["XLA_FLAGS"] = (flags + " " + flag).strip()
    result = {"cap": cap, "xla_flags": environ.get("XLA_FLAGS")}
    try:
        base, path = _library()
        symbols = _symbols(path)
        function = ctypes.CFUNCTYPE(ctypes.c_uint64)(base + symbols[FUNCTION])
        before = function()  # initialises the static
        static = ctypes.c_uint64.from_address(base + symbols[STATIC])
        if static.value != before:
            raise RuntimeError(f"the static holds {static.value:#x}, the function "
                               f"returned {before:#x}: not the symbol expected")
        cpu = _cpu_flags()
        expected = sum(1 << bit for name, bit in YNN_BITS if name in cpu)
        if before & 0x7F != expected:
            raise RuntimeError(f"YNNPACK's low flags {before & 0x7F:#x} do not match "
                               f"/proc/cpuinfo's {expected:#x}: another layout")
        static.value = before & keep
        after = function()
        if after != before & keep:
            raise RuntimeError(f"the cap did not hold ({after:#x})")
    except (RuntimeError, OSError, ValueError) as e:
        STATE.clear()
        STATE.update(applied=False, reason=str(e), **result)
        return dict(STATE)
    STATE.clear()
    STATE.update(applied=True, ynnpack_flags_before=hex(before), ynnpack_flags=hex(after),
                 **result)
    return dict(STATE)
