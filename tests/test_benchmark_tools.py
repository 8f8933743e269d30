"""The benchmarks' own measuring code (not timings: those are never asserted)."""

import importlib.util
import sys

import numpy as np
import pytest
import tensorflow as tf
from testing import REPO


def load_benchmark(name):
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location(
            f"benchmark_{name}", REPO / "benchmarks" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    return module


def test_profile_counts_xla_compiled_calls_and_matmuls(tmp_path):
    # The evaluation step's fused kernels run as XLA executables, whose profiler
    # events carry no "op:Type" name: they were left out of the op time.
    profile_steps = load_benchmark("profile_steps")
    kernel = tf.function(lambda a: tf.nn.relu(a * 2.0 + 1.0), jit_compile=True)

    @tf.function
    def step(a, b):
        return kernel(tf.matmul(a, b))

    a = tf.constant(np.ones((64, 64), np.float32))
    step(a, a)  # traced and compiled before the profile
    tf.profiler.experimental.start(str(tmp_path))
    for _ in range(2):
        step(a, a).numpy()
    tf.profiler.experimental.stop()

    by_type = profile_steps.op_times(tf, str(tmp_path), 2)
    assert by_type[profile_steps.XLA_TYPE] > 0
    matmuls = {op: ms for op, ms in by_type.items() if "MatMul" in op}
    assert matmuls and profile_steps.matmul_ms(by_type) == sum(matmuls.values())
    by_name = profile_steps.op_times(tf, str(tmp_path), 2, by_name=True)
    assert f"xla:{profile_steps.XLA_TYPE}" in by_name
    assert np.isclose(sum(by_name.values()), sum(by_type.values()))
    assert profile_steps.matmul_ms({"a:AddV2": 1.0, "b:_MklBatchMatMulV2": 2.0,
                                    "_MklNativeFusedMatMul": 3.0}) == 5.0


def test_attention_matmuls_reports_each_product_and_mode(capsys):
    import json

    from keras_txl import host

    attention_matmuls = load_benchmark("attention_matmuls")
    attention_matmuls.main(["--batch", "1", "--heads", "2", "--head-dim", "4", "--queries", "4",
                            "--keys", "8", "--hidden", "8", "--inner", "16", "--calls", "3",
                            "--threads", "0", "--no-peak"])
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("{"))
    report = json.loads(line)
    assert set(report["results"]) == {f"{p}_{m}" for p in ("scores", "mixing", "dense")
                                      for m in ("graph", "xla")}
    for name, r in report["results"].items():
        flops = 2 * 4 * 8 * 16 if name.startswith("dense") else 2 * 1 * 2 * 4 * 4 * 8
        assert r["ms"] > 0
        assert abs(r["gflops"] - flops / r["ms"] / 1e6) <= 0.05 + 1e-3 * r["gflops"]
    # TensorFlow's own answer, which the host module predicts.
    assert report["host"]["tensorflow_onednn"] is host.cpu_info()["tensorflow_onednn"]
    assert report["host"]["gpus"] == [  # the GPUs TensorFlow sees, by name
        tf.config.experimental.get_device_details(d).get("device_name")
        for d in tf.config.list_physical_devices("GPU")]


@pytest.mark.parametrize("benchmark, argv, message", [
    ("adaptive_nll", ["--rows", "0"], "--rows must be >= 1; received 0"),
    ("adaptive_nll", ["--eval-steps", "2"], "--eval-steps must be >= 3; received 2"),
    ("adaptive_nll", ["--num-layers", "0"], "--num-layers must be >= 1; received 0"),
    ("adaptive_nll", ["--cutoffs", "200;400"],
     "--cutoffs must be comma-separated positive integers"),
    ("adaptive_nll", ["--modes", "xla,fast"],
     "--modes must name some of graph, xla, xla_chunks, xla_every_row"),
    ("step_memory", ["--batch", "0"], "--batch must be >= 1, received 0"),
    ("step_memory", ["--eval-steps", "1"], "--eval-steps must be >= 2, received 1"),
    ("step_memory", ["--layers", "0"], "--layers must be >= 1, received 0"),
    ("eval_cache", ["--memory", "1800;2800"],
     "--memory must be comma-separated positive integers, e.g. 1800,2800; received"),
    ("eval_cache", ["--memory", "0"], "--memory must be comma-separated positive integers"),
    ("eval_cache", ["--rounds", "0"], "--rounds must be >= 1; received 0"),
    ("eval_cache", ["--hidden", "48"], "--hidden must be a positive multiple of 32; received 48"),
    ("eval_weight_casts", ["--rounds", "0"], "--rounds must be >= 1; received 0"),
    ("eval_weight_casts", ["--steps", "-1"], "--steps must be >= 1; received -1"),
])
def test_benchmarks_reject_bad_arguments(benchmark, argv, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        load_benchmark(benchmark).main(argv)
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err


def test_adaptive_nll_benchmark_counts_the_logits_each_mode_computes(capsys):
    import json

    adaptive_nll = load_benchmark("adaptive_nll")
    adaptive_nll.main(["--vocabulary-size", "3000", "--cutoffs", "100,200,1000",
                       "--hidden-dim", "16", "--num-layers", "1", "--rows", "256", "--calls", "2", "--threads", "0",
                       "--no-peak", "--eval-memory", "8", "--eval-segment", "4",
                       "--eval-steps", "3"])
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("{"))
    report = json.loads(line)
    results = report["results"]
    assert set(results) == {"graph", "xla", "xla_chunks", "xla_every_row", "eval_xla",
                            "eval_xla_chunks", "eval_xla_every_row"}
    for mode in ("eval_xla", "eval_xla_chunks", "eval_xla_every_row"):  # the whole model's step
        assert (results[mode]["memory"], results[mode]["segment"]) == (8, 4)
        # (ms is rounded to 0.01: a few ms carry a 0.1 %-0.3 % rounding)
        assert results[mode]["tokens_per_s"] == pytest.approx(4 / results[mode]["ms"] * 1e3,
                                                              rel=5e-3)
    # The same loss three ways; the logits each computes: the head for every
    # token plus the tails for the exact rows, a bucket's rows (these tails are
    # small: n x V_i within the buckets' budget), whole chunks of rows, every row.
    for mode in ("xla", "xla_chunks", "xla_every_row"):
        assert results[mode]["loss"] == pytest.approx(results["graph"]["loss"], rel=1e-5)
    fractions = report["cluster_fractions"]
    head = 100 + 3
    tails = (100, 800, 2000)
    counts = [round(f * 256) for f in fractions[1:]]  # (fractions are rounded to 1e-4)
    exact = head + sum(c * v for c, v in zip(counts, tails)) / 256
    assert results["graph"]["logits_per_token"] == round(exact)
    assert results["xla_every_row"]["logits_per_token"] == head + sum(tails)
    assert report["capacities"] == [8, 16, 32, 64, 128, 256] and report["chunk_rows"] == 64
    assert 256 * max(tails) <= report["bucketed_logits_max"]
    bucket = [min(c for c in report["capacities"] if c >= count) for count in counts]
    assert results["xla"]["logits_per_token"] == round(
        head + sum(b * v for b, v in zip(bucket, tails)) / 256)
    chunked = [-(-c // 64) * 64 for c in counts]
    assert results["xla_chunks"]["logits_per_token"] == round(
        head + sum(rows * v for rows, v in zip(chunked, tails)) / 256)


def test_step_memory_benchmark_counts_the_allocators_bytes(tmp_path):
    import json
    import os
    import subprocess

    # Its own process: TensorFlow reads TF_CPU_ALLOCATOR_USE_BFC when it starts.
    command = [sys.executable, str(REPO / "benchmarks" / "step_memory.py"), "--preset", "tiny",
               "--batch", "2", "--segment", "8", "--memory", "8", "--train-steps", "2",
               "--eval-steps", "3"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(next(x for x in result.stdout.splitlines() if x.startswith("{")))
    assert report["built_mib"] > 0 and report["cache_built_mib"] > 0
    assert report["train_peak_mib"] >= report["built_mib"]
    assert report["eval_peak_mib"] >= report["built_mib"] + report["cache_built_mib"]
    # After each evaluation step the next cache, of the built one's size, is held
    # (and the trace's constants, a few KB): nothing grows from step to step.
    for held in report["eval_held_mib"]:
        assert report["cache_built_mib"] <= held <= report["cache_built_mib"] + 0.1
    assert report["host"]["framework"] == "tensorflow"


def test_eval_cache_benchmark_times_both_caches_on_the_same_numbers(capsys):
    import json

    load_benchmark("eval_cache").main(["--memory", "24,40", "--segment", "8", "--layers", "2",
                                       "--hidden", "64", "--rounds", "2", "--steps", "2",
                                       "--precision", "float32", "--jit", "off",
                                       "--threads", "0", "--no-peak"])
    out = capsys.readouterr().out
    report = json.loads(next(x for x in out.splitlines() if x.startswith("{")))
    assert [row["memory"] for row in report["results"]] == [24, 40]
    for row in report["results"]:
        assert row["keys"] == row["memory"] + 8 and row["jit_compile"] is False
        # Without the memory in the cache the step computes the same NLL.
        assert row["nll_max_difference"] == 0.0
        for name in ("keep_memory", "eval_cache"):
            assert len(row[f"{name}_ms_per_token_rounds"]) == 2
        assert row["speedup"] == pytest.approx(
            row["keep_memory_ms_per_token"] / row["eval_cache_ms_per_token"], rel=1e-2)
    assert report["host"]["cores"] >= 1 and "| 24 | False |" in out


CAP_PROBE = """
import json, sys
import numpy as np
import tensorflow as tf
sys.path.insert(0, sys.argv[1])
from xla_isa_cap import cap_xla_kernels
state = cap_xla_kernels()
a = np.random.default_rng(0).normal(size=(96, 64)).astype("float32")
xla = tf.function(lambda x: tf.matmul(x, x, transpose_b=True), jit_compile=True)(a)
state["max_difference"] = float(np.abs(xla.numpy() - a @ a.T).max())
print(json.dumps(state))
"""


def run_cap_probe(cap, **extra):
    import json
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items()
           if k not in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "XLA_FLAGS")}
    if cap:
        env["ONEDNN_MAX_CPU_ISA"] = cap
    env.update(extra)
    out = subprocess.run([sys.executable, "-c", CAP_PROBE, str(REPO / "benchmarks")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_xla_isa_cap_holds_xla_kernels_to_the_onednn_cap():
    # An "AVX2-capped" XLA step ran YNNPACK's AVX-512 matmuls: the cap must reach
    # XLA's flags and YNNPACK's kernel choice, and leave the numbers right.
    import platform
    import shutil

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("YNNPACK's x86 flags only")
    state = run_cap_probe("AVX2")
    assert state["cap"] == "AVX2" and "--xla_cpu_max_isa=AVX2" in state["xla_flags"]
    if shutil.which("nm") is None:
        assert not state["applied"] and "nm" in state["reason"]
    else:
        assert state["applied"], state
        before, after = int(state["ynnpack_flags_before"], 16), int(state["ynnpack_flags"], 16)
        assert after == before & 0x7F  # nothing above FMA3 left
    assert state["max_difference"] < 1e-3
    # Without a cap below AVX-512, or with the switch off, nothing is touched.
    state = run_cap_probe(None)
    assert not state["applied"] and "no cap below AVX-512" in state["reason"]
    assert state["max_difference"] < 1e-3
    state = run_cap_probe("AVX2", BENCH_XLA_ISA_CAP="0")
    assert not state["applied"] and "BENCH_XLA_ISA_CAP=0" in state["reason"]
    assert "xla_flags" not in state


def test_eval_weight_casts_benchmark_times_both_policies_on_the_same_weights(capsys):
    import json

    load_benchmark("eval_weight_casts").main(["--batch", "1", "--rounds", "2", "--steps", "1",
                                              "--threads", "0", "--no-peak"])
    out = capsys.readouterr().out
    report = json.loads(next(x for x in out.splitlines() if x.startswith("{")))
    policies = ("mixed_bfloat16", "bfloat16")
    assert set(report["ms_per_step"]) == set(policies)
    for policy in policies:
        assert len(report["ms_per_step_rounds"][policy]) == 2
        assert report["ms_per_step"][policy] > 0
    assert report["stored_bfloat16_speedup"] == pytest.approx(
        report["ms_per_step"]["mixed_bfloat16"] / report["ms_per_step"]["bfloat16"], rel=1e-2)
    # The same weights (cast once to bfloat16): the NLL agrees to bfloat16's precision,
    # so the two timings are of the same computation.
    assert report["nll_max_difference"] < 0.05
    assert "stored in bfloat16 (bfloat16 policy)" in out
