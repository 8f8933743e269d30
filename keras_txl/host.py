"""What CPU this process runs on, and which precision suits it.

`cpu_info()` names the CPU (model name, logical cores this process may use, the
instruction-set extensions that matter for matmuls) and the instruction-set caps in
force from the environment: oneDNN's `ONEDNN_MAX_CPU_ISA` (TensorFlow's CPU kernels, and
PyTorch's mkldnn ones), PyTorch's `ATEN_CPU_CAPABILITY` (ATen's vectorised kernels) and
MKL's `MKL_ENABLE_INSTRUCTIONS` (PyTorch's CPU BLAS). The "effective ISA" is the lower
of what the CPU has and what the cap allows.

`auto_precision()` picks the training precision from it: `"mixed_bfloat16"` where the
effective ISA has AMX, or AVX512_BF16 on an AMD Zen 4 or Zen 5 (the hosts where bf16 was measured
faster than fp32; not on Intel CPUs with AVX512_BF16 alone: see its docstring),
`"float32"` elsewhere. `gpu_auto_precision()` does the same for
an NVIDIA GPU from its compute capability.

Nothing here imports TensorFlow: benchmarks, the command line and the PyTorch peer's
process use it as well.
"""

import os
import platform

# Instruction-set levels, lowest first. Each names the highest extension that matters
# for the matmuls and element-wise kernels of both frameworks.
LEVELS = ("baseline", "AVX", "AVX2", "AVX512", "AVX512_BF16", "AMX")

# /proc/cpuinfo flag -> the name reported in `isa`.
FLAGS = {
    "avx2": "AVX2",
    "avx512f": "AVX512F",
    "avx512_bf16": "AVX512_BF16",
    "avx512_fp16": "AVX512_FP16",
    "amx_bf16": "AMX_BF16",
    "amx_tile": "AMX_TILE",
}

# oneDNN's `ONEDNN_MAX_CPU_ISA` values, lowest first (aliases share a rank) -> (rank in
# oneDNN's own order, the highest of `LEVELS` it allows). The rank tells which cap leaves
# which half-precision matmuls to oneDNN (`precision_cap_conflict`); the level is what
# `cpu_info` reports.
ONEDNN_ISA = {
    "SSE41": (0, "baseline"), "AVX": (1, "AVX"), "AVX2": (2, "AVX2"),
    "AVX2_VNNI": (3, "AVX2"), "AVX2_VNNI_2": (4, "AVX2"), "AVX512_CORE": (5, "AVX512"),
    "AVX512_CORE_VNNI": (6, "AVX512"), "AVX512_CORE_BF16": (7, "AVX512_BF16"),
    "AVX512_CORE_FP16": (8, "AVX512_BF16"), "AVX10_1_512": (8, "AVX512_BF16"),
    "AVX512_CORE_AMX": (9, "AMX"), "AVX512_CORE_AMX_FP16": (10, "AMX"),
    "AVX10_1_512_AMX": (10, "AMX"), "AVX10_1_512_AMX_FP16": (11, "AMX"),
}
ONEDNN_LEVELS = {name: level for name, (_, level) in ONEDNN_ISA.items()}

# Environment variable -> {value (upper case) -> the highest level it allows}.
# A value that is not listed (e.g. "ALL", "DEFAULT", a level this table does not know)
# is reported but does not cap anything.
CAPS = {
    # oneDNN's dispatcher (TensorFlow's oneDNN kernels; PyTorch's mkldnn kernels).
    "ONEDNN_MAX_CPU_ISA": ONEDNN_LEVELS,
    # oneDNN's older name for it, read where ONEDNN_MAX_CPU_ISA is not set (`isa_caps`
    # drops it when both are).
    "DNNL_MAX_CPU_ISA": ONEDNN_LEVELS,
    # PyTorch's ATen kernels. "avx512" is ATen's top level: it does not keep PyTorch's
    # bf16 matmuls (MKL / oneDNN) off AVX512_BF16 or AMX, so it caps nothing here.
    "ATEN_CPU_CAPABILITY": {"DEFAULT": "baseline", "AVX2": "AVX2"},
    # MKL's dispatcher (PyTorch's fp32 CPU matmuls).
    "MKL_ENABLE_INSTRUCTIONS": {"SSE4_2": "baseline", "AVX": "AVX", "AVX2": "AVX2",
                                "AVX512": "AVX512"},
}

# Which caps act on which framework's kernels.
FRAMEWORK_CAPS = {
    "tensorflow": ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"),
    "torch": ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA",
              "DNNL_MAX_CPU_ISA"),
}

# Where `auto_precision` picks mixed_bfloat16 on any CPU: AMX (see its docstring for why
# AVX512_BF16 alone is not enough everywhere).
AUTO_BF16_LEVELS = ("AMX",)
# (vendor_id, cpu family) of the CPUs where AVX512_BF16 alone made bf16 faster than fp32:
# AMD family 0x19 with AVX-512 is Zen 4 (Zen 3, the same family, has no AVX-512). Zen 4
# runs a 512-bit FMA as two 256-bit halves, so its fp32 matmul peak is half an AVX-512
# Intel core's per clock, while `vdpbf16ps` does twice the multiply-adds per instruction.
# AMD family 0x1A is Zen 5: full-width 512-bit FMAs, and still TensorFlow's bf16 matmuls
# ran at 2x its fp32 ones there (870 against 439 GFLOP/s on 2 cores), unlike the Intel
# Xeons without AMX (twelfth session, docs/benchmarks.md "Precision per host").
AUTO_BF16_AVX512_BF16_CPUS = (("AuthenticAMD", 25), ("AuthenticAMD", 26))


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def cpuinfo_fields(text):
    """{lower-case key: value} of the first processor's entry of a /proc/cpuinfo text."""
    fields = {}
    for line in (text or "").splitlines():
        if not line.strip():
            if fields:
                break  # the end of the first processor's entry
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip().lower(), value.strip())
    return fields


def _cpu_family(fields):
    try:
        return int(fields.get("cpu family", ""))
    except ValueError:
        return None


def isa_level(flags):
    """The highest of `LEVELS` that a set of /proc/cpuinfo flags supports."""
    if {"amx_bf16", "amx_tile"} <= flags:
        return "AMX"
    if "avx512_bf16" in flags:
        return "AVX512_BF16"
    if "avx512f" in flags:
        return "AVX512"
    if "avx2" in flags:
        return "AVX2"
    if "avx" in flags:
        return "AVX"
    return "baseline"


def lower_level(a, b):
    """The lower of two `LEVELS` (None: no limit)."""
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b, key=LEVELS.index)


def isa_caps(environ=None):
    """{variable: {"value": as set, "level": the level it allows or None}} of the caps set."""
    environ = os.environ if environ is None else environ
    caps = {}
    for name, table in CAPS.items():
        value = environ.get(name)
        if value:
            caps[name] = {"value": value, "level": table.get(value.strip().upper())}
    if "ONEDNN_MAX_CPU_ISA" in caps:
        caps.pop("DNNL_MAX_CPU_ISA", None)  # oneDNN reads the new name first
    return caps


def _cores():
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def _cgroup_cpu_limit():
    """CPUs allowed by a cgroup v2 quota (`cpu.max`), or None where there is none."""
    text = _read("/sys/fs/cgroup/cpu.max")
    if not text:
        return None
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        return round(int(parts[0]) / int(parts[1]), 2)
    except (ValueError, ZeroDivisionError):
        return None


def cpu_info(cpuinfo_text=None, environ=None):
    """A dict describing this CPU and the ISA caps in force.

    Keys: `cpu` (model name), `vendor` and `cpu_family` (`vendor_id`, `cpu family`; None
    where unknown), `machine`, `cores` (logical cores this process may run on,
    `os.sched_getaffinity`), `cpu_quota` (cgroup v2 limit or None), `isa` (which of AVX2,
    AVX512F, AVX512_BF16, AVX512_FP16, AMX_BF16, AMX_TILE the CPU has; None where unknown: not x86
    Linux), `cpu_isa` (the highest of `LEVELS`), `caps` (`isa_caps()`), `effective_isa`
    (the CPU's level lowered by every cap set) and `effective_isa_by_framework` (lowered
    by the caps that act on "tensorflow" / "torch" only) and `tensorflow_onednn`
    (`tensorflow_uses_onednn`).

    `cpuinfo_text` and `environ` replace /proc/cpuinfo and os.environ (for tests).
    """
    text = _read("/proc/cpuinfo") if cpuinfo_text is None else cpuinfo_text
    fields = cpuinfo_fields(text)
    model = fields.get("model name") or None
    flags = set(fields.get("flags", "").split())
    machine = platform.machine()
    if model is None:
        model = platform.processor() or machine or "unknown"
    known = bool(flags)
    level = isa_level(flags) if known else None
    caps = isa_caps(environ)
    effective = level
    for cap in caps.values():
        effective = lower_level(effective, cap["level"]) if effective else None
    by_framework = {}
    for framework, names in FRAMEWORK_CAPS.items():
        value = level
        for name in names:
            if name in caps and value:
                value = lower_level(value, caps[name]["level"])
        by_framework[framework] = value
    return {
        "cpu": model,
        "vendor": fields.get("vendor_id") or None,
        "cpu_family": _cpu_family(fields),
        "machine": machine,
        "cores": _cores() if cpuinfo_text is None else None,
        "cpu_quota": _cgroup_cpu_limit() if cpuinfo_text is None else None,
        "isa": [name for flag, name in FLAGS.items() if flag in flags] if known else None,
        "cpu_isa": level,
        "caps": caps,
        "effective_isa": effective,
        "effective_isa_by_framework": by_framework,
        "tensorflow_onednn": tensorflow_uses_onednn(environ, flags),
    }


# TensorFlow 2.21's default for its oneDNN kernels on x86 Linux, where nothing sets
# `TF_ENABLE_ONEDNN_OPTS` (`DefaultOneDnnPolicy` in tensorflow/core/util/port.cc): on
# only where the CPU has one of these /proc/cpuinfo flags. An AVX2 CPU without AVX-VNNI
# (AMD Zen 3 and older, Intel before Alder Lake) runs Eigen's kernels instead.
TENSORFLOW_ONEDNN_DEFAULT_FLAGS = ("avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile",
                                   "amx_int8", "amx_bf16")


def _read_bool(value):
    """`TF_ENABLE_ONEDNN_OPTS` as TensorFlow reads it: True, False, or None (not set, or
    a value it ignores with a warning)."""
    value = (value or "").strip().lower()
    return {"1": True, "true": True, "0": False, "false": False}.get(value)


def tensorflow_onednn_default(flags, system=None, machine=None):
    """Whether TensorFlow 2.21 turns its oneDNN kernels on by itself for a CPU with
    these /proc/cpuinfo `flags` (a set): on x86 Linux only with one of
    `TENSORFLOW_ONEDNN_DEFAULT_FLAGS`, always on x86 Windows, never elsewhere (the one
    Arm CPU it names is left out here). A string of space-separated flags, as in
    /proc/cpuinfo, is split."""
    if isinstance(flags, str):
        flags = set(flags.split())
    system = platform.system() if system is None else system
    machine = (platform.machine() if machine is None else machine).lower()
    if machine not in ("x86_64", "amd64"):
        return False
    if system == "Windows":
        return True
    if system == "Linux":
        return any(flag in flags for flag in TENSORFLOW_ONEDNN_DEFAULT_FLAGS)
    return False


def tensorflow_uses_onednn(environ=None, flags=None):
    """Whether TensorFlow runs its CPU ops with its oneDNN kernels.

    `TF_ENABLE_ONEDNN_OPTS` decides where it is set ("1"/"true" or "0"/"false");
    otherwise TensorFlow's own default for this CPU (`tensorflow_onednn_default`;
    `flags`: the /proc/cpuinfo flags, default this host's). keras-txl sets the variable
    to "1" at import on x86 Linux (`prefer_tensorflow_onednn`). Without oneDNN the ops
    are Eigen's, no oneDNN cap applies to them, and bf16 is far slower than fp32 (eighth
    session, AMX Xeon: 855 against 2,181 training tokens/s, 6,884 against 9,245 in
    evaluation).
    """
    environ = os.environ if environ is None else environ
    setting = _read_bool(environ.get("TF_ENABLE_ONEDNN_OPTS"))
    if setting is not None:
        return setting
    if flags is None:
        flags = set(cpuinfo_fields(_read("/proc/cpuinfo")).get("flags", "").split())
    return tensorflow_onednn_default(flags)


def prefer_tensorflow_onednn(environ=None, modules=None, system=None, machine=None,
                             flags=None):
    """Turns TensorFlow's oneDNN kernels on for this process where its default leaves
    them off: sets `TF_ENABLE_ONEDNN_OPTS=1` on x86 Linux when nothing set it and
    TensorFlow is not imported yet (it reads the variable once, at import).

    TensorFlow 2.21 runs Eigen's kernels on x86 CPUs without AVX-512 VNNI/BF16, AVX-VNNI
    or AMX (`tensorflow_onednn_default`). There its batched matmuls are a loop of one
    gemm per matrix: on a real AVX2 AMD EPYC (Zen 3) the attention's (64 x 128 x 32) x
    (32 x 256) product took 9.4 ms against 5.7 in PyTorch, and keras-txl trained at 1.27x
    the reference. On a Zen 5 capped at AVX2 (`ONEDNN_MAX_CPU_ISA=AVX2`), Eigen's kernels
    (`TF_ENABLE_ONEDNN_OPTS=0`) against oneDNN's: that product 1.8-2.0 against 1.1 ms
    (`benchmarks/attention_matmuls.py`), training 1.33x-1.41x faster (two series of 5
    pairs, docs/benchmarks.md). A user's setting, either way, is kept.

    Where TensorFlow was imported first, unset, on a CPU where that leaves the kernels
    off, it is too late: a warning says so and how to change it (`flags`: the
    /proc/cpuinfo flags, default this host's).

    `environ` (default `os.environ`) is changed in place; `modules` stands for
    `sys.modules`. Returns True if it set the variable.
    """
    import sys
    import warnings

    environ = os.environ if environ is None else environ
    modules = sys.modules if modules is None else modules
    system = platform.system() if system is None else system
    machine = (platform.machine() if machine is None else machine).lower()
    if system != "Linux" or machine not in ("x86_64", "amd64"):
        return False
    if "TF_ENABLE_ONEDNN_OPTS" in environ:
        return False
    if "tensorflow" in modules:
        if flags is None:
            flags = set(cpuinfo_fields(_read("/proc/cpuinfo")).get("flags", "").split())
        if not tensorflow_onednn_default(flags, system, machine):
            warnings.warn(
                "TensorFlow was imported before keras_txl on a CPU where it leaves its "
                "oneDNN kernels off (no AVX-512 VNNI/BF16, AVX-VNNI or AMX): its batched "
                "matmuls run one matrix at a time, and training on this CPU is up to ~1.4x "
                "slower. Import keras_txl first, or set TF_ENABLE_ONEDNN_OPTS=1 before "
                "TensorFlow is imported (TF_ENABLE_ONEDNN_OPTS=0 keeps Eigen's kernels "
                "without this warning).", stacklevel=3)
        return False
    environ["TF_ENABLE_ONEDNN_OPTS"] = "1"
    return True


def tensorflow_level(info):
    """The ISA level TensorFlow's oneDNN kernels run at, from a `cpu_info()`
    dict: the CPU's, lowered by the caps that act on TensorFlow (None where
    unknown)."""
    return (info.get("effective_isa_by_framework") or {}).get(
        "tensorflow", info.get("effective_isa"))


def auto_precision(info=None):
    """`"mixed_bfloat16"` where bf16 is known to pay on this CPU, else `"float32"`.

    - AMX (TensorFlow's effective ISA: the CPU's, lowered by `ONEDNN_MAX_CPU_ISA` when
      that caps it): bf16. The tiles multiply bf16 at many times the fp32 rate: on the
      eighth session's AMX Xeon TensorFlow's bf16 matmuls ran at ~950 GFLOP/s and the
      throughput benchmark measured mixed_bfloat16 1.42x fp32 in training and 1.31x in
      evaluation (4,939 vs 3,471 and 19,587 vs 14,923 tokens/s, medians of 5).
    - AVX512_BF16 on an AMD Zen 4 (`AUTO_BF16_AVX512_BF16_CPUS`): bf16. Zen 4 executes
      512-bit fp32 FMAs as two halves, and `vdpbf16ps` does twice their multiply-adds:
      TensorFlow's bf16 matmuls ran at ~2x its fp32 ones, and the throughput benchmark
      measured mixed_bfloat16 1.40x fp32 in training (third session, 5,029 vs 3,584
      tokens/s) and, in the seventh session, 1.54x in training and 1.43x in evaluation
      (3,888 vs 2,525 and 13,642 vs 9,547 tokens/s, medians of 5; docs/benchmarks.md).
    - AVX512_BF16 on an AMD Zen 5 (family 26): bf16. Its fp32 FMAs are full-width, yet
      TensorFlow's bf16 matmuls ran at 2x its fp32 ones (870 vs 439 GFLOP/s), and the
      throughput benchmark measured mixed_bfloat16 1.37x fp32 in training and 1.49x in
      evaluation (6,290 vs 4,600 and 29,596 vs 19,921 tokens/s, medians of 3, twelfth
      session), with a lower peak RSS.
    - AVX512_BF16 elsewhere (the Intel Xeons of sessions 4 and 6): float32. Their fp32
      FMAs are full-width, bf16 measured 0.66x fp32 in training (1,764 vs 2,654): the
      casts around every element-wise pass cost more than the dot product saves. An
      unmeasured CPU with AVX512_BF16 stays here too.
    - Without bf16 instructions oneDNN emulates bf16 (convert to fp32, multiply, round
      back): slower than fp32 (an AVX2-only AMD EPYC: 1,035 training tokens/s in
      mixed_bfloat16 against ~1,400 in float32). float32.
    - Unknown CPUs (no /proc/cpuinfo flags, e.g. not Linux or not x86): float32.
    - TensorFlow's oneDNN kernels turned off (`TF_ENABLE_ONEDNN_OPTS=0`): float32 on any
      CPU. Eigen's bf16 kernels ran at 0.39x fp32 in training on the AMX Xeon.

    A user who measured otherwise on their host passes the precision explicitly. This is
    about CPUs; on a GPU see `gpu_auto_precision`. `info`: a `cpu_info()` dict (default:
    this host's).
    """
    info = cpu_info() if info is None else info
    if info.get("tensorflow_onednn") is False:
        return "float32"  # Eigen's bf16 kernels: 0.39x fp32 in training
    level = tensorflow_level(info)
    if level in AUTO_BF16_LEVELS:
        return "mixed_bfloat16"
    cpu = (info.get("vendor"), info.get("cpu_family"))
    if level == "AVX512_BF16" and cpu in AUTO_BF16_AVX512_BF16_CPUS:
        return "mixed_bfloat16"
    return "float32"


# Half-precision dtype -> (the CPU extension that makes TensorFlow send its matmuls to
# oneDNN, the lowest oneDNN level that has them). Measured with TensorFlow 2.21 on an AMX
# Xeon: bf16 matmuls crashed under every cap from SSE41 to AVX2_VNNI_2 and ran from
# AVX512_CORE; fp16 ones crashed up to AVX512_CORE_BF16 and ran from AVX512_CORE_FP16.
HALF_PRECISION_NEEDS = {
    "bfloat16": ("AVX512F", "AVX512_CORE"),
    "float16": ("AVX512_FP16", "AVX512_CORE_FP16"),
}


def _policy_name(precision):
    """The name of a Keras dtype policy given as a string or a policy object."""
    name = getattr(precision, "name", precision)
    if not isinstance(name, str) or not name:
        raise ValueError(
            "`precision` must be a Keras dtype policy or its name (e.g. 'float32', "
            f"'mixed_bfloat16', 'mixed_float16'). Received: precision={precision!r}.")
    return name


def precision_cap_conflict(precision, info=None):
    """Why TensorFlow's half-precision matmuls of `precision` (a Keras dtype policy
    name) would crash this process, or None.

    TensorFlow 2.21 sends bfloat16 matmuls to oneDNN when the CPU itself has AVX-512
    (and float16 ones when it has AVX512_FP16): it reads CPUID, not oneDNN's cap. Capped
    below the level that has them (`ONEDNN_MAX_CPU_ISA`, or its older name
    `DNNL_MAX_CPU_ISA`), oneDNN has no such matmul to give it and the process ends with a
    segmentation fault at the first one (`HALF_PRECISION_NEEDS`). A CPU without the
    extension takes TensorFlow's own (Eigen) kernels instead, as every CPU does with
    `TF_ENABLE_ONEDNN_OPTS=0`: slow, but no conflict.
    `info`: a `cpu_info()` dict (default: this host's).
    """
    precision = _policy_name(precision)
    # "bfloat16" is tried first ("mixed_bfloat16" also contains "float16").
    half = next((d for d in HALF_PRECISION_NEEDS if d in precision), None)
    if half is None:
        return None
    info = cpu_info() if info is None else info
    if not isinstance(info, dict):
        raise ValueError(f"`info` must be a cpu_info() dict or None. Received type "
                         f"{type(info).__name__}.")
    if info.get("tensorflow_onednn") is False:
        return None  # Eigen's kernels: no oneDNN, no cap (measured: they run)
    extension, needed = HALF_PRECISION_NEEDS[half]
    if extension not in (info.get("isa") or ()):
        return None
    caps = info.get("caps") or {}
    name = next((n for n in FRAMEWORK_CAPS["tensorflow"] if n in caps), None)
    if name is None:
        return None
    value = caps[name]["value"]
    rank = ONEDNN_ISA.get(value.strip().upper(), (None,))[0]
    if rank is None or rank >= ONEDNN_ISA[needed][0]:
        return None  # "ALL", an unknown value, or a level that has the matmuls
    return (
        f"{name}={value} caps oneDNN below {needed} on a CPU with {extension} "
        f"({info.get('cpu')}): TensorFlow still sends {half} matmuls to oneDNN here, "
        f"which has none at that level, and the process would crash (segmentation "
        f"fault) at the first one")


def check_cpu_precision(precision, info=None):
    """Raises ValueError where `precision` (a Keras dtype policy name) would crash
    TensorFlow's CPU kernels on this host (`precision_cap_conflict`)."""
    conflict = precision_cap_conflict(precision, info)
    if conflict:
        raise ValueError(
            f"precision={_policy_name(precision)!r} cannot run here: {conflict}. Use "
            f"precision='float32' (or 'auto', which picks it under this cap), or "
            f"unset the variable or raise it to that level.")


def native_bfloat16(info=None):
    """Whether TensorFlow's oneDNN kernels have bfloat16 instructions on this
    CPU (AVX512_BF16 or AMX, after any cap); elsewhere bfloat16 is emulated,
    as it is by Eigen's kernels wherever oneDNN's are off."""
    info = cpu_info() if info is None else info
    if info.get("tensorflow_onednn") is False:
        return False
    level = tensorflow_level(info)
    return level is not None and LEVELS.index(level) >= LEVELS.index("AVX512_BF16")


def xla_evaluation_pays(info=None):
    """Whether XLA-compiling a whole float32 evaluation step beats graph mode
    at any memory length on this CPU: where TensorFlow runs Eigen's kernels
    instead of oneDNN's (x86 with `TF_ENABLE_ONEDNN_OPTS=0`, or TensorFlow's
    default on a CPU without AVX-512 VNNI/BF16, AVX-VNNI or AMX when
    TensorFlow was imported before keras-txl; `tensorflow_uses_onednn`).

    Eigen's kernels are built for AVX without FMA (TensorFlow's own start-up
    message) and run a batched matmul one matrix at a time; XLA's dots are
    YNNPACK's, which pick the CPU's best kernels. On a real AVX2 AMD EPYC
    (Zen 3, 2 cores, T = M = 128, batch 8) the XLA step ran 1.34x-1.45x the
    graph-mode one, and on the AMX Xeon with `TF_ENABLE_ONEDNN_OPTS=0`
    1.6x-1.75x (8,247-9,320 against 5,146-5,328 tokens/s).

    With oneDNN's kernels graph mode stays, at every ISA level: on the AMX
    Xeon with oneDNN and XLA's kernels both capped at AVX2
    (`benchmarks/xla_isa_cap.py`) the graph-mode step evaluated 6,205
    against 5,579 tokens/s (medians of 5 alternating rounds, eighteenth
    session). Earlier "AVX2-capped" figures that favoured XLA (24,098
    against 14,097 on a Zen 5) had left YNNPACK on AVX-512, which no
    environment variable caps.
    """
    info = cpu_info() if info is None else info
    if tensorflow_level(info) is None:
        return False  # not x86 Linux: the level (and Eigen's build) unknown
    return info.get("tensorflow_onednn") is False


def gpu_auto_precision(compute_capability):
    """The training precision "auto" picks on an NVIDIA GPU of `compute_capability`.

    - 8.0 and newer (Ampere, Ada, Hopper, Blackwell): `"mixed_bfloat16"`. The tensor
      cores multiply bf16 at the fp16 rate, and bf16 has float32's exponent range, so
      no loss scaling is needed (nothing to skip, nothing to tune).
    - 7.0 to 7.x (Volta, Turing): `"mixed_float16"`. Their tensor cores have no bf16
      (TensorFlow emulates it, slower than float32); float16 runs on the tensor cores
      at many times the fp32 rate, with dynamic loss scaling for its narrow range.
    - older, or unknown (`None`): `"float32"` (no tensor cores).

    `compute_capability`: `(major, minor)`, as
    `tf.config.experimental.get_device_details(gpu)["compute_capability"]`, or None.
    """
    if not compute_capability:
        return "float32"
    capability = tuple(int(c) for c in compute_capability)
    if capability >= (8, 0):
        return "mixed_bfloat16"
    if capability >= (7, 0):
        return "mixed_float16"
    return "float32"


def describe(info=None):
    """One line naming the host, for the top of benchmark tables."""
    info = cpu_info() if info is None else info
    isa = info.get("isa")
    isa = "unknown" if isa is None else (", ".join(isa) or "none of AVX2/AVX-512/AMX")
    line = f"{info['cpu']} ({info.get('machine')}), {info.get('cores')} cores"
    if info.get("cpu_quota"):
        line += f" (cgroup quota {info['cpu_quota']})"
    line += f"; ISA: {isa}"
    if info.get("caps"):
        caps = ", ".join(f"{k}={v['value']}" for k, v in info["caps"].items())
        line += f"; capped by {caps} -> effective {info.get('effective_isa')}"
    if info.get("tensorflow_onednn") is False:
        line += ("; TensorFlow's oneDNN kernels off (TF_ENABLE_ONEDNN_OPTS=0, or "
                 "TensorFlow's default for this CPU: import keras_txl first)")
    return line
