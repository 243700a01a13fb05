"""The llama.cpp build is portable and a build that would trap is refused with an error, not a signal."""
import pytest

from multidraft.decoding.llama_build import check_build, compiled_features, cpu_flags

NATIVE_SPR = ("CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | AVX512 = 1 | "
              "AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | AMX_INT8 = 1 | LLAMAFILE = 1 | OPENMP = 1 | "
              "REPACK = 1 |")
PORTABLE = "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | LLAMAFILE = 1 | OPENMP = 1 |"
ZEN2 = {"pni", "ssse3", "avx", "avx2", "f16c", "fma", "bmi2"}
SPR = ZEN2 | {"avx512f", "avx512vbmi", "avx512_vnni", "avx512_bf16", "amx_int8", "amx_tile", "amx_bf16"}


def test_compiled_features_reads_the_system_info_line():
    f = compiled_features(NATIVE_SPR)
    assert f["AVX2"] and f["AMX_INT8"] and f["AVX512_BF16"] and f["REPACK"]
    assert compiled_features("CPU : AVX = 0 | AVX2 = 1 |") == {"AVX": False, "AVX2": True}


def test_the_portable_build_runs_everywhere():
    for flags in (ZEN2, SPR, None):
        check_build(PORTABLE, flags, allow_amx=False)


def test_an_amx_build_is_refused_even_where_the_cpu_advertises_amx():
    with pytest.raises(ImportError, match="AMX.*install_llama_cpp.sh"):
        check_build(NATIVE_SPR, SPR, allow_amx=False)
    check_build(NATIVE_SPR, SPR, allow_amx=True)  # the user's explicit choice on real AMX hardware


def test_a_build_for_a_wider_cpu_is_refused():
    avx512 = NATIVE_SPR.replace("AMX_INT8 = 1", "AMX_INT8 = 0")
    with pytest.raises(ImportError, match="AVX512, AVX512_BF16, AVX512_VBMI, AVX512_VNNI.*this CPU lacks"):
        check_build(avx512, ZEN2, allow_amx=False)


def test_cpu_flags_parses_cpuinfo():
    assert cpu_flags("processor : 0\nflags\t\t: fpu avx2 fma\n") == {"fpu", "avx2", "fma"}
    assert cpu_flags("processor : 0\n") is None


def test_the_installed_llama_cpp_is_the_portable_build():
    """What `make test` installs (scripts/install_llama_cpp.sh): AVX2 yes, AVX-512 and AMX no.
    A native build (pip's default, -march=native) fails here on any AVX-512 machine, which is how
    the AMX crash of issue 25 would have been caught before it reached an Intel AMX VM."""
    llama_cpp = pytest.importorskip("llama_cpp")
    info = llama_cpp.llama_print_system_info().decode()
    f = compiled_features(info)
    assert f.get("AVX2") is True, info
    assert not any(f.get(n) for n in ("AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16", "AMX_INT8")), info
    check_build(info, cpu_flags())
