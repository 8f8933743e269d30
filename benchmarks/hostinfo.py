"""The host block of every benchmark: which CPU, which ISA (and cap), how many cores,
and the matmul peak measured in the framework's own process.

`keras_txl.host.cpu_info()` names the CPU; this adds the framework, its version and the
measured matmul peak (the MFU denominator): TensorFlow's for keras-txl, PyTorch's for
the reference (measured in the reference's process, under its own ISA cap). Every
benchmark's JSON line carries the block under "host" and every table starts with
`host_line(block)`.

As a script, prints one JSON line (the block) for the framework named, in this Python:

    python benchmarks/hostinfo.py --framework tensorflow   # or torch, or none
    ../peer-venv/bin/python benchmarks/hostinfo.py --framework torch

Only needs `keras_txl/host.py` (no TensorFlow), so it also runs in the reference's venv.
"""

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from keras_txl import host  # noqa: E402

PEAK_N, PEAK_REPEATS = 2048, 11


def tf_matmul_peak_gflops(tf, n=PEAK_N, repeats=PEAK_REPEATS, dtype="float32"):
    """Matmul throughput of TensorFlow on this machine (best of 3 bursts), GFLOP/s."""
    a = tf.cast(tf.random.normal([n, n]), dtype)
    b = tf.cast(tf.random.normal([n, n]), dtype)
    f = tf.function(lambda x, y: tf.matmul(x, y))
    for _ in range(3):
        f(a, b).numpy()
    best = 0.0
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(repeats):
            c = f(a, b)
        c.numpy()
        best = max(best, 2 * n**3 * repeats / (time.perf_counter() - t0) / 1e9)
    return best


def torch_matmul_peak_gflops(torch, n=PEAK_N, repeats=PEAK_REPEATS, dtype="float32"):
    """Matmul throughput of PyTorch on this machine's CPU (best of 3 bursts), GFLOP/s."""
    dtype = getattr(torch, dtype)
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=generator).to(dtype)
    b = torch.randn(n, n, generator=generator).to(dtype)
    with torch.no_grad():
        for _ in range(3):
            torch.mm(a, b)
        best = 0.0
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(repeats):
                torch.mm(a, b)
            best = max(best, 2 * n**3 * repeats / (time.perf_counter() - t0) / 1e9)
    return best


def host_block(framework=None, peak=True, dtypes=("float32",)):
    """`keras_txl.host.cpu_info()` plus the framework's version and matmul peak.

    `framework`: the imported `tensorflow` or `torch` module (its thread settings are the
    ones the benchmark uses), or None. `matmul_peak_gflops` maps dtype -> GFLOP/s
    (None when `peak` is false or there is no framework).
    """
    block = host.cpu_info()
    block["load_average"] = [round(x, 2) for x in os.getloadavg()]
    name = getattr(framework, "__name__", None)
    block["framework"] = name
    block["auto_precision"] = host.auto_precision(block)
    peaks = None
    if name == "tensorflow":
        # TensorFlow's own answer (it read TF_ENABLE_ONEDNN_OPTS and the CPU at import).
        from tensorflow.python.util import _pywrap_util_port

        block["tensorflow_onednn"] = bool(_pywrap_util_port.IsMklEnabled())
        block["framework_version"] = framework.__version__
        block["threads"] = framework.config.threading.get_intra_op_parallelism_threads()
        # The GPUs the run could use (where "auto" picks precision and XLA by the GPU).
        block["gpus"] = [framework.config.experimental.get_device_details(d).get("device_name")
                         for d in framework.config.list_physical_devices("GPU")]
        if peak:
            peaks = {d: round(tf_matmul_peak_gflops(framework, dtype=d), 1) for d in dtypes}
    elif name == "torch":
        block["framework_version"] = framework.__version__
        block["threads"] = framework.get_num_threads()
        # What ATen dispatches to (ATEN_CPU_CAPABILITY lowers it).
        block["torch_cpu_capability"] = framework.backends.cpu.get_cpu_capability()
        block["gpus"] = [framework.cuda.get_device_name(i)
                         for i in range(framework.cuda.device_count())]
        if peak:
            peaks = {d: round(torch_matmul_peak_gflops(framework, dtype=d), 1) for d in dtypes}
    block["matmul_peak_gflops"] = peaks
    block["matmul_peak_shape"] = [PEAK_N, PEAK_N, PEAK_N] if peaks else None
    cap = sys.modules.get("xla_isa_cap")
    if name == "tensorflow" and cap is not None:
        # Whether XLA's own kernels were held to the oneDNN cap (`xla_isa_cap.py`).
        block["xla_kernels_cap"] = dict(cap.STATE)
    return block


def host_block_in(python, framework="tensorflow", env=None, peak=True, threads=2):
    """`host_block` measured in a fresh process of `python` (another venv, another ISA cap)."""
    import subprocess

    command = [python, os.path.abspath(__file__), "--framework", framework,
               "--threads", str(threads)] + ([] if peak else ["--no-peak"])
    out = subprocess.run(command, capture_output=True, text=True, env=env)
    if out.returncode:
        raise RuntimeError(f"{command} exited with {out.returncode}:\n{out.stderr[-2000:]}")
    return json.loads([line for line in out.stdout.splitlines() if line.startswith("{")][-1])


def host_line(block):
    """One line for the top of a table."""
    line = "host: " + host.describe(block)
    if block.get("framework"):
        line += f"; {block['framework']} {block.get('framework_version', '')}".rstrip()
        if block.get("torch_cpu_capability"):
            line += f" (ATen {block['torch_cpu_capability']})"
        if block.get("threads"):
            line += f", {block['threads']} threads"
    cap = block.get("xla_kernels_cap")
    if cap and cap.get("cap"):
        line += (f"; XLA's kernels capped at {cap['cap']} too" if cap["applied"]
                 else f"; XLA's kernels NOT capped ({cap['reason']})")
    if block.get("gpus"):
        line += "; GPU " + ", ".join(block["gpus"])
    peaks = block.get("matmul_peak_gflops")
    if peaks:
        line += "; matmul peak " + ", ".join(f"{v:,.0f} GFLOP/s {d}" for d, v in peaks.items())
    if block.get("load_average"):
        line += f"; load {block['load_average'][0]}"
    return line


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--framework", choices=["tensorflow", "torch", "none"], default="none")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-peak", action="store_true")
    parser.add_argument("--dtypes", default="float32",
                        help="comma-separated dtypes of the matmul peak (e.g. float32,bfloat16)")
    args = parser.parse_args(argv)
    framework = None
    if args.framework == "tensorflow":
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        import tensorflow as framework

        framework.config.threading.set_intra_op_parallelism_threads(args.threads)
        framework.config.threading.set_inter_op_parallelism_threads(args.threads)
    elif args.framework == "torch":
        import torch as framework

        framework.set_num_threads(args.threads)
    block = host_block(framework, peak=not args.no_peak, dtypes=tuple(args.dtypes.split(",")))
    print(json.dumps(block))
    print(host_line(block), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
