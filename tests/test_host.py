"""keras_txl.host: /proc/cpuinfo parsing, ISA caps from the environment, auto precision."""

import os
import platform
import subprocess
import sys
import warnings

import pytest

from keras_txl import host

BASE_FLAGS = ("fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 "
              "clflush mmx fxsr sse sse2 ht syscall nx lm constant_tsc pni pclmulqdq ssse3 "
              "fma cx16 sse4_1 sse4_2 movbe popcnt aes xsave avx f16c rdrand hypervisor")


def cpuinfo(model, extra_flags, processors=2, vendor="GenuineIntel", family=6):
    entries = []
    for i in range(processors):
        entries.append(f"processor\t: {i}\nvendor_id\t: {vendor}\ncpu family\t: {family}\n"
                       f"model name\t: {model}\n"
                       f"flags\t\t: {BASE_FLAGS} {extra_flags}\nbogomips\t: 4000.0\n")
    return "\n".join(entries)


# An AVX2-only AMD EPYC (Zen 2): no AVX-512 at all.
EPYC_AVX2 = cpuinfo("AMD EPYC 7B12 64-Core Processor", "bmi1 avx2 smep bmi2 sha_ni clzero",
                    vendor="AuthenticAMD", family=23)
# Cascade Lake: AVX-512 without bf16.
XEON_AVX512 = cpuinfo("Intel(R) Xeon(R) Platinum 8280 CPU @ 2.70GHz",
                      "avx2 avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni")
# Cooper Lake / the VMs of these sessions: AVX-512 with bf16, no AMX.
XEON_BF16 = cpuinfo("Intel(R) Xeon(R) Processor",
                    "avx2 avx512f avx512dq avx512cd avx512bw avx512vl avx_vnni avx512_bf16 "
                    "avx512_vnni avx512_fp16")
# AMD EPYC Genoa (Zen 4): AVX-512 with bf16.
EPYC_GENOA = cpuinfo("AMD EPYC 9654 96-Core Processor",
                     "avx2 avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16 avx512_vnni",
                     vendor="AuthenticAMD", family=25)
# AMD EPYC Turin (Zen 5): AVX512_BF16 on full-width units; bf16 measured 1.37x fp32.
EPYC_TURIN = cpuinfo("AMD EPYC 9755 128-Core Processor",
                     "avx2 avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16 avx512_vnni "
                     "avx512_vp2intersect", vendor="AuthenticAMD", family=26)
# Sapphire Rapids: AMX tiles.
SPR_AMX = cpuinfo("Intel(R) Xeon(R) Platinum 8480+",
                  "avx2 avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16 avx512_fp16 "
                  "amx_bf16 amx_tile amx_int8")
# An arm64 machine: "Features", no "flags", no "model name".
ARM = "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd evtstrm aes pmull sha1 bf16\n"


@pytest.mark.parametrize("text, model, isa, level, precision", [
    (EPYC_AVX2, "AMD EPYC 7B12 64-Core Processor", ["AVX2"], "AVX2", "float32"),
    (XEON_AVX512, "Intel(R) Xeon(R) Platinum 8280 CPU @ 2.70GHz", ["AVX2", "AVX512F"],
     "AVX512", "float32"),
    # AVX512_BF16 alone: bf16 measured slower than fp32 on Intel Xeons, faster on Zen 4
    # and Zen 5; an unmeasured family stays fp32.
    (XEON_BF16, "Intel(R) Xeon(R) Processor",
     ["AVX2", "AVX512F", "AVX512_BF16", "AVX512_FP16"], "AVX512_BF16", "float32"),
    (EPYC_GENOA, "AMD EPYC 9654 96-Core Processor", ["AVX2", "AVX512F", "AVX512_BF16"],
     "AVX512_BF16", "mixed_bfloat16"),
    (EPYC_TURIN, "AMD EPYC 9755 128-Core Processor", ["AVX2", "AVX512F", "AVX512_BF16"],
     "AVX512_BF16", "mixed_bfloat16"),
    (SPR_AMX, "Intel(R) Xeon(R) Platinum 8480+",
     ["AVX2", "AVX512F", "AVX512_BF16", "AVX512_FP16", "AMX_BF16", "AMX_TILE"], "AMX",
     "mixed_bfloat16"),
])
def test_cpuinfo_levels_and_auto_precision_without_caps(text, model, isa, level, precision):
    info = host.cpu_info(cpuinfo_text=text, environ={})
    assert info["cpu"] == model
    assert info["isa"] == isa
    assert info["cpu_isa"] == info["effective_isa"] == level
    assert info["effective_isa_by_framework"] == {"tensorflow": level, "torch": level}
    assert info["caps"] == {}
    assert host.auto_precision(info) == precision


def test_an_unmeasured_family_with_avx512_bf16_stays_float32():
    future = EPYC_TURIN.replace("cpu family\t: 26", "cpu family\t: 27")
    info = host.cpu_info(cpuinfo_text=future, environ={})
    assert (info["cpu_family"], info["effective_isa"]) == (27, "AVX512_BF16")
    assert host.auto_precision(info) == "float32"


def test_vendor_and_family_are_read_from_the_first_entry():
    info = host.cpu_info(cpuinfo_text=EPYC_GENOA, environ={})
    assert (info["vendor"], info["cpu_family"]) == ("AuthenticAMD", 25)
    info = host.cpu_info(cpuinfo_text=ARM, environ={})
    assert (info["vendor"], info["cpu_family"]) == (None, None)


def test_a_cap_below_bf16_means_float32():
    # oneDNN capped at AVX2 on a bf16 / AMX CPU: TensorFlow's kernels have no bf16 there.
    for text in (XEON_BF16, SPR_AMX, EPYC_GENOA):
        info = host.cpu_info(cpuinfo_text=text, environ={"ONEDNN_MAX_CPU_ISA": "AVX2"})
        assert info["caps"] == {"ONEDNN_MAX_CPU_ISA": {"value": "AVX2", "level": "AVX2"}}
        assert info["effective_isa"] == "AVX2"
        assert info["effective_isa_by_framework"]["tensorflow"] == "AVX2"
        assert host.auto_precision(info) == "float32"
    capped = host.cpu_info(cpuinfo_text=SPR_AMX,
                           environ={"ONEDNN_MAX_CPU_ISA": "avx512_core"})
    assert capped["effective_isa"] == "AVX512"  # values are case-insensitive
    assert host.auto_precision(capped) == "float32"
    # A Zen 4 with oneDNN kept off AVX512_BF16 has no bf16 dot product left.
    capped = host.cpu_info(cpuinfo_text=EPYC_GENOA,
                           environ={"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI"})
    assert capped["effective_isa"] == "AVX512"
    assert host.auto_precision(capped) == "float32"


def test_a_cap_at_or_above_the_cpu_changes_nothing():
    info = host.cpu_info(cpuinfo_text=SPR_AMX, environ={"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"})
    assert info["effective_isa"] == "AMX"
    assert host.auto_precision(info) == "mixed_bfloat16"
    # Capped below AMX: float32.
    info = host.cpu_info(cpuinfo_text=SPR_AMX,
                         environ={"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"})
    assert info["effective_isa"] == "AVX512_BF16"
    assert host.auto_precision(info) == "float32"
    # A cap above what the CPU has does not raise it.
    info = host.cpu_info(cpuinfo_text=EPYC_AVX2, environ={"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"})
    assert info["effective_isa"] == "AVX2"
    assert host.auto_precision(info) == "float32"
    # "ALL" / unknown values are reported but cap nothing.
    info = host.cpu_info(cpuinfo_text=XEON_BF16, environ={"ONEDNN_MAX_CPU_ISA": "ALL"})
    assert info["caps"] == {"ONEDNN_MAX_CPU_ISA": {"value": "ALL", "level": None}}
    assert info["effective_isa"] == "AVX512_BF16"


def test_torch_caps_act_on_torch_only():
    env = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
    info = host.cpu_info(cpuinfo_text=SPR_AMX, environ=env)
    assert info["effective_isa"] == "AVX2"
    assert info["effective_isa_by_framework"] == {"tensorflow": "AMX", "torch": "AVX2"}
    # auto_precision is TensorFlow's choice: ATen's cap does not touch oneDNN in TF.
    assert host.auto_precision(info) == "mixed_bfloat16"
    # ATen's "avx512" is its top level: no cap on bf16 matmuls.
    info = host.cpu_info(cpuinfo_text=SPR_AMX, environ={"ATEN_CPU_CAPABILITY": "avx512"})
    assert info["effective_isa_by_framework"]["torch"] == "AMX"
    # Both caps of `compare_peer.py --isa avx2`.
    both = dict(env, ONEDNN_MAX_CPU_ISA="AVX2")
    info = host.cpu_info(cpuinfo_text=SPR_AMX, environ=both)
    assert info["effective_isa_by_framework"] == {"tensorflow": "AVX2", "torch": "AVX2"}
    assert host.auto_precision(info) == "float32"


def test_tensorflow_without_onednn_gets_float32_and_no_cap_conflict():
    # TF_ENABLE_ONEDNN_OPTS=0: Eigen's kernels, bf16 0.39x fp32 on the AMX Xeon, and
    # bf16 / fp16 matmuls ran under ONEDNN_MAX_CPU_ISA=AVX2 (no oneDNN to cap).
    for value in ("0", "false", " False "):
        env = {"TF_ENABLE_ONEDNN_OPTS": value, "ONEDNN_MAX_CPU_ISA": "AVX2"}
        info = host.cpu_info(cpuinfo_text=SPR_AMX, environ=env)
        assert info["tensorflow_onednn"] is False
        assert host.auto_precision(info) == "float32"
        assert host.precision_cap_conflict("mixed_bfloat16", info) is None
        assert host.precision_cap_conflict("mixed_float16", info) is None
        assert "oneDNN kernels off" in host.describe(info)
        no_cap = host.cpu_info(cpuinfo_text=EPYC_GENOA, environ={"TF_ENABLE_ONEDNN_OPTS": value})
        assert host.auto_precision(no_cap) == "float32"
    for env in ({}, {"TF_ENABLE_ONEDNN_OPTS": "1"}, {"TF_ENABLE_ONEDNN_OPTS": "true"}):
        info = host.cpu_info(cpuinfo_text=SPR_AMX, environ=env)
        assert info["tensorflow_onednn"] is True
        assert host.auto_precision(info) == "mixed_bfloat16"
        assert "oneDNN" not in host.describe(info)


def test_tensorflow_onednn_default_follows_tensorflows_cpu_policy():
    # TensorFlow 2.21 (port.cc): on x86 Linux only with AVX-512 VNNI/BF16, AVX-VNNI or
    # AMX; a real AVX2 EPYC (Zen 3) runs Eigen's kernels unless the variable says so.
    flags = lambda text: set(host.cpuinfo_fields(text)["flags"].split())  # noqa: E731
    assert host.tensorflow_onednn_default(flags(EPYC_AVX2), "Linux", "x86_64") is False
    for text in (SPR_AMX, XEON_BF16, EPYC_GENOA):
        assert host.tensorflow_onednn_default(flags(text), "Linux", "x86_64") is True
    assert host.tensorflow_onednn_default(flags(EPYC_AVX2), "Windows", "AMD64") is True
    assert host.tensorflow_onednn_default({"avx512_bf16"}, "Linux", "aarch64") is False
    assert host.tensorflow_onednn_default({"avx512_bf16"}, "Darwin", "x86_64") is False
    # /proc/cpuinfo's own string is split, not searched for substrings.
    assert host.tensorflow_onednn_default("avx2 avx512_vnni", "Linux", "x86_64") is True
    assert host.tensorflow_onednn_default("avx2 avx512_vnnix", "Linux", "x86_64") is False
    # Eigen's kernels (oneDNN off) emulate bfloat16 even where the CPU has it.
    on = host.cpu_info(cpuinfo_text=SPR_AMX, environ={"TF_ENABLE_ONEDNN_OPTS": "1"})
    off = host.cpu_info(cpuinfo_text=SPR_AMX, environ={"TF_ENABLE_ONEDNN_OPTS": "0"})
    assert host.native_bfloat16(on) is True and host.native_bfloat16(off) is False
    if platform.system() == "Linux" and platform.machine() == "x86_64":
        info = host.cpu_info(cpuinfo_text=EPYC_AVX2, environ={})
        assert info["tensorflow_onednn"] is False
        assert host.cpu_info(cpuinfo_text=EPYC_GENOA, environ={})["tensorflow_onednn"] is True
    for value, expected in (("1", True), ("TRUE", True), ("0", False), ("false", False)):
        info = host.cpu_info(cpuinfo_text=EPYC_AVX2, environ={"TF_ENABLE_ONEDNN_OPTS": value})
        assert info["tensorflow_onednn"] is expected


def test_prefer_tensorflow_onednn_sets_the_variable_only_before_tensorflow_and_unset():
    environ = {}
    assert host.prefer_tensorflow_onednn(environ, {}, "Linux", "x86_64") is True
    assert environ == {"TF_ENABLE_ONEDNN_OPTS": "1"}
    for kept in ("0", "1", "false"):  # the user's setting, either way
        environ = {"TF_ENABLE_ONEDNN_OPTS": kept}
        assert host.prefer_tensorflow_onednn(environ, {}, "Linux", "x86_64") is False
        assert environ == {"TF_ENABLE_ONEDNN_OPTS": kept}
    environ = {}  # TensorFlow read it already: too late, left alone
    assert host.prefer_tensorflow_onednn(environ, {"tensorflow": object()}, "Linux",
                                         "x86_64", flags={"avx2", "avx512_vnni"}) is False
    assert environ == {}
    # ... and said so where TensorFlow's default left its oneDNN kernels off (Zen 3).
    with pytest.warns(UserWarning, match="TF_ENABLE_ONEDNN_OPTS=1 before TensorFlow"):
        assert host.prefer_tensorflow_onednn(environ, {"tensorflow": object()}, "Linux",
                                             "x86_64", flags={"avx2", "fma"}) is False
    assert environ == {}
    with warnings.catch_warnings():  # the user's own setting: no warning
        warnings.simplefilter("error")
        assert host.prefer_tensorflow_onednn({"TF_ENABLE_ONEDNN_OPTS": "0"},
                                             {"tensorflow": object()}, "Linux", "x86_64",
                                             flags={"avx2"}) is False
    for system, machine in (("Linux", "aarch64"), ("Darwin", "x86_64"), ("Windows", "AMD64")):
        assert host.prefer_tensorflow_onednn(environ, {}, system, machine) is False
        assert environ == {}


def test_tensorflow_onednn_prediction_matches_tensorflow_in_this_process():
    # conftest imports keras_txl before TensorFlow, as users do: on x86 Linux the
    # variable is set, and TensorFlow's own answer agrees with the host block's.
    from tensorflow.python.util import _pywrap_util_port

    if platform.system() == "Linux" and platform.machine() == "x86_64":
        assert os.environ.get("TF_ENABLE_ONEDNN_OPTS") is not None
    assert host.cpu_info()["tensorflow_onednn"] is bool(_pywrap_util_port.IsMklEnabled())


def test_unknown_cpus_get_float32():
    info = host.cpu_info(cpuinfo_text=ARM, environ={})
    assert info["isa"] is None and info["cpu_isa"] is None and info["effective_isa"] is None
    assert info["cpu"]  # the platform's name for it, never empty
    assert host.auto_precision(info) == "float32"
    info = host.cpu_info(cpuinfo_text="", environ={"ONEDNN_MAX_CPU_ISA": "AVX2"})
    assert info["effective_isa"] is None
    assert host.auto_precision(info) == "float32"


def test_this_host():
    info = host.cpu_info()
    assert info["cores"] >= 1
    assert host.auto_precision(info) in ("float32", "mixed_bfloat16")
    line = host.describe(info)
    assert info["cpu"] in line and f"{info['cores']} cores" in line
    assert "capped" in host.describe(host.cpu_info(cpuinfo_text=XEON_BF16,
                                                   environ={"ONEDNN_MAX_CPU_ISA": "AVX2"}))


def test_importing_it_does_not_import_tensorflow():
    # Benchmarks, the CLI and the PyTorch peer's process use it without TensorFlow.
    code = ("import sys; import keras_txl.host as h; h.cpu_info(); h.auto_precision(); "
            "print('tensorflow' in sys.modules, 'keras' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_half_precision_under_a_cap_without_its_matmuls_is_refused():
    # TensorFlow 2.21 sends bf16 matmuls to oneDNN on any AVX-512 CPU (fp16 ones on any
    # AVX512_FP16 CPU); capped below AVX512_CORE (AVX512_CORE_FP16), oneDNN has none and
    # the process segfaults (measured on an AMX Xeon).
    for text in (XEON_AVX512, XEON_BF16, SPR_AMX, EPYC_GENOA):
        for cap in ("AVX2", "avx2_vnni", "AVX", "SSE41"):
            info = host.cpu_info(cpuinfo_text=text, environ={"ONEDNN_MAX_CPU_ISA": cap})
            conflict = host.precision_cap_conflict("mixed_bfloat16", info)
            assert f"ONEDNN_MAX_CPU_ISA={cap} caps oneDNN below AVX512_CORE" in conflict
            for precision in ("mixed_bfloat16", "bfloat16"):
                with pytest.raises(ValueError, match=f"precision='{precision}' cannot run "
                                                     f"here: ONEDNN_MAX_CPU_ISA={cap}"):
                    host.check_cpu_precision(precision, info)
            host.check_cpu_precision("float32", info)  # float32 is fine under any cap
            assert host.auto_precision(info) == "float32"
        # From AVX512_CORE oneDNN has bf16 matmuls: nothing to refuse.
        for cap in ("AVX512_CORE", "AVX512_CORE_BF16", "AVX512_CORE_AMX", "ALL"):
            info = host.cpu_info(cpuinfo_text=text, environ={"ONEDNN_MAX_CPU_ISA": cap})
            assert host.precision_cap_conflict("mixed_bfloat16", info) is None
            host.check_cpu_precision("mixed_bfloat16", info)
    # float16: only on CPUs with AVX512_FP16 (the bf16 Xeon and the AMX one here), and
    # up to AVX512_CORE_BF16.
    for text in (XEON_BF16, SPR_AMX):
        for cap in ("AVX2", "AVX512_CORE", "AVX512_CORE_BF16"):
            info = host.cpu_info(cpuinfo_text=text, environ={"ONEDNN_MAX_CPU_ISA": cap})
            with pytest.raises(ValueError, match=f"precision='mixed_float16' cannot run "
                                                 f"here: ONEDNN_MAX_CPU_ISA={cap} caps "
                                                 f"oneDNN below AVX512_CORE_FP16"):
                host.check_cpu_precision("mixed_float16", info)
        for cap in ("AVX512_CORE_FP16", "AVX10_1_512", "AVX512_CORE_AMX"):
            info = host.cpu_info(cpuinfo_text=text, environ={"ONEDNN_MAX_CPU_ISA": cap})
            assert host.precision_cap_conflict("mixed_float16", info) is None
    for text in (XEON_AVX512, EPYC_GENOA, EPYC_AVX2):  # no AVX512_FP16: Eigen's kernels
        info = host.cpu_info(cpuinfo_text=text, environ={"ONEDNN_MAX_CPU_ISA": "AVX2"})
        assert host.precision_cap_conflict("mixed_float16", info) is None
    # oneDNN's older name for the cap acts the same, unless the new name is set too
    # (oneDNN then reads the new one).
    info = host.cpu_info(cpuinfo_text=SPR_AMX, environ={"DNNL_MAX_CPU_ISA": "AVX2"})
    assert info["effective_isa_by_framework"]["tensorflow"] == "AVX2"
    assert host.auto_precision(info) == "float32"
    with pytest.raises(ValueError, match="DNNL_MAX_CPU_ISA=AVX2 caps oneDNN below"):
        host.check_cpu_precision("mixed_bfloat16", info)
    both = {"DNNL_MAX_CPU_ISA": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}
    info = host.cpu_info(cpuinfo_text=SPR_AMX, environ=both)
    assert list(info["caps"]) == ["ONEDNN_MAX_CPU_ISA"]
    assert info["effective_isa"] == "AMX"
    assert host.precision_cap_conflict("mixed_bfloat16", info) is None
    # Without AVX-512 TensorFlow keeps bf16 on its own kernels (slow, but they run);
    # without a cap, or with PyTorch's caps only, there is nothing to conflict with.
    for text, env in ((EPYC_AVX2, {"ONEDNN_MAX_CPU_ISA": "AVX2"}), (SPR_AMX, {}),
                      (SPR_AMX, {"ATEN_CPU_CAPABILITY": "avx2"}), (ARM, {}),
                      ("", {"ONEDNN_MAX_CPU_ISA": "AVX2"})):
        info = host.cpu_info(cpuinfo_text=text, environ=env)
        for precision in ("mixed_bfloat16", "mixed_float16"):
            assert host.precision_cap_conflict(precision, info) is None


def test_the_precision_check_takes_a_policy_or_its_name_and_rejects_anything_else():
    import keras

    capped = host.cpu_info(cpuinfo_text=SPR_AMX, environ={"ONEDNN_MAX_CPU_ISA": "AVX2"})
    policy = keras.dtype_policies.DTypePolicy("mixed_bfloat16")
    with pytest.raises(ValueError, match="precision='mixed_bfloat16' cannot run here"):
        host.check_cpu_precision(policy, capped)
    for bad in (None, 3, "", ["mixed_bfloat16"]):
        with pytest.raises(ValueError, match=r"`precision` must be a Keras dtype policy "
                                             r"or its name .* Received: precision="):
            host.precision_cap_conflict(bad, capped)
    with pytest.raises(ValueError, match="`info` must be a cpu_info\\(\\) dict or None. "
                                         "Received type str"):
        host.check_cpu_precision("mixed_bfloat16", "AVX2")


def test_a_half_precision_model_is_refused_at_construction_under_such_a_cap(monkeypatch):
    # The check acts where every model is made (the backbone), so training,
    # evaluation, generation and a user's own `set_dtype_policy` all get the error
    # instead of a segfault at the first matmul. cpu_info is replaced: setting the
    # variable in this process could cap oneDNN for the tests after this one.
    import tensorflow as tf
    from testing import tiny_config

    import keras_txl

    if tf.config.list_physical_devices("GPU"):
        pytest.skip("with a GPU the matmuls run there and nothing is checked")
    capped = host.cpu_info(cpuinfo_text=SPR_AMX, environ={"ONEDNN_MAX_CPU_ISA": "AVX2"})
    monkeypatch.setattr(host, "cpu_info", lambda *args, **kwargs: capped)
    for precision in ("mixed_bfloat16", "mixed_float16"):
        with pytest.raises(ValueError, match=f"precision='{precision}' cannot run here: "
                                             "ONEDNN_MAX_CPU_ISA=AVX2"):
            keras_txl.TransformerXLCausalLM(tiny_config(), dtype=precision)
    keras_txl.TransformerXLCausalLM(tiny_config())  # float32 builds under the same cap


def test_xla_evaluation_pays_where_tensorflow_runs_eigen_kernels():
    # Eigen's kernels (oneDNN off) lose to XLA's dots; oneDNN's do not, capped
    # or not (an honest AVX2 cap also holds XLA's YNNPACK kernels at AVX2).
    def pays(text, environ):
        return host.xla_evaluation_pays(host.cpu_info(cpuinfo_text=text, environ=environ))

    # An AVX2 CPU: TensorFlow's own default there is Eigen's kernels.
    assert pays(EPYC_AVX2, {})
    for text in (EPYC_AVX2, XEON_AVX512, XEON_BF16, EPYC_GENOA, SPR_AMX):
        assert pays(text, {"TF_ENABLE_ONEDNN_OPTS": "0"})
        assert not pays(text, {"TF_ENABLE_ONEDNN_OPTS": "1"})
        assert not pays(text, {"TF_ENABLE_ONEDNN_OPTS": "1", "ONEDNN_MAX_CPU_ISA": "AVX2"})
    for text in (XEON_BF16, EPYC_GENOA, SPR_AMX):  # oneDNN on by TensorFlow's default
        assert not pays(text, {})
        assert not pays(text, {"ONEDNN_MAX_CPU_ISA": "AVX2"})
    # A CPU whose level is unknown (arm64) keeps graph mode.
    assert not pays(ARM, {})
    assert not pays(ARM, {"TF_ENABLE_ONEDNN_OPTS": "0"})


def test_native_bfloat16_from_avx512_bf16_on():
    for text, native in ((EPYC_AVX2, False), (XEON_AVX512, False), (XEON_BF16, True),
                         (EPYC_GENOA, True), (SPR_AMX, True), (ARM, False)):
        assert host.native_bfloat16(host.cpu_info(cpuinfo_text=text, environ={})) is native
    capped = host.cpu_info(cpuinfo_text=SPR_AMX, environ={"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"})
    assert host.native_bfloat16(capped) is False
