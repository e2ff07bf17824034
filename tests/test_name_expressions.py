"""C++ kernels by name (compile's name_expressions), as CuPy's RawModule(name_expressions=...) and
NVRTC's nvrtcAddNameExpression / hipRTC's hiprtcAddNameExpression give them: real compiles for
sm_90 and gfx90a, the lowered names mapped back, the warning for kernels no plain name reaches."""

from __future__ import annotations

import warnings

import pytest

import shimrt
from shimrt import CompileError, UsageError

TEMPLATE = """
template <typename T> __global__ void scale(T* x, T a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= a;
}
namespace ns { __global__ void fill(float* x, int n) { if (threadIdx.x < n) x[threadIdx.x] = 1.0f; } }
"""


@pytest.mark.parametrize("target", ["sm_90", "gfx90a"])
def test_name_expressions_instantiate_templates_and_map_back_to_their_lowered_names(target, cache_dir, request):
    if target == "gfx90a":
        request.getfixturevalue("hiprtc")
    expressions = ["scale<float>", "scale<double>", "ns::fill"]
    program = shimrt.compile(TEMPLATE, target, name_expressions=expressions)
    assert set(program.names) == set(expressions)
    for e in expressions:
        lowered = program.kernel(e)
        assert lowered.startswith("_Z") and lowered in program.resources, (e, lowered)
    assert program.kernel("scale<float>") != program.kernel("scale<double>")
    assert "fill" in program.kernel("ns::fill") and "ns" in program.kernel("ns::fill")
    # A lowered name is a kernel's own name too; anything else is refused, naming what there is.
    assert program.kernel(program.names["ns::fill"]) == program.names["ns::fill"]
    with pytest.raises(UsageError, match=r"kernel must be a kernel or name expression of .*scale<float> \(_Z"):
        program.kernel("scale<int>")
    # The cache keeps the mapping: the same compile again is served from it, names and all.
    again = shimrt.compile(TEMPLATE, target, name_expressions=expressions)
    assert again.from_cache and again.names == program.names
    # Another set of expressions is another compile (the key holds them).
    other = shimrt.compile(TEMPLATE, target, name_expressions=["scale<int>"])
    assert not other.from_cache and set(other.names) == {"scale<int>"}


@pytest.mark.parametrize("bad, why", [("nothing<float>", 'identifier "nothing" is undefined'),
                                      ("scale<flaot>", 'identifier "flaot" is undefined')])
def test_an_expression_that_names_no_kernel_is_a_compile_error_that_names_it(bad, why, cache_dir):
    """Said first in a line of its own (NVRTC's log, kept below it, speaks of "__nv_name_map")."""
    with pytest.raises(CompileError) as caught:
        shimrt.compile(TEMPLATE, "sm_90", name_expressions=["scale<float>", bad])
    first = str(caught.value).splitlines()[0]
    assert first.startswith(f"name expression {bad!r} names no kernel the source can instantiate ({why})"), first
    assert "__nv_name_map" in caught.value.log


def test_a_programs_resources_are_found_by_name_expression_too(cache_dir):
    program = shimrt.compile(TEMPLATE, "sm_90", name_expressions=["scale<float>"])
    lowered = program.names["scale<float>"]
    assert program.resources["scale<float>"] is program.resources[lowered]
    assert "scale<float>" in program.resources and program.resources.get("scale<float>").registers > 0
    assert "scale<int>" not in program.resources and program.resources.get("scale<int>") is None
    with pytest.raises(KeyError):
        program.resources["scale<int>"]
    # its keys are still the binary's names
    assert lowered in list(program.resources) and "scale<float>" not in list(program.resources)
    again = shimrt.compile(TEMPLATE, "sm_90", name_expressions=["scale<float>"])  # from the cache
    assert again.from_cache and again.resources["scale<float>"] == program.resources[lowered]


def test_device_compile_takes_what_compile_takes():
    import inspect

    from shimrt import compiler
    from shimrt.device import Device
    ours = dict(inspect.signature(Device.compile).parameters)
    ours.pop("self")
    theirs = dict(inspect.signature(compiler.compile).parameters)
    theirs.pop("target")
    assert list(ours) == list(theirs)
    assert all(ours[n].default == theirs[n].default and ours[n].kind == theirs[n].kind for n in ours)


@pytest.mark.parametrize("value, message", [
    ("scale<float>", "name_expressions must be a list of C\\+\\+ kernel names"),
    (["scale<float>", "scale<float>"], "must list each name once"),
    ([""], "each name expression must be"),
    ([3], "each name expression must be"),
    (["a\0b"], "each name expression must be a string .*without NUL"),
])
def test_bad_name_expressions_are_refused_before_the_compiler(value, message, cache_dir):
    with pytest.raises(UsageError, match=message):
        shimrt.compile(TEMPLATE, "sm_90", name_expressions=value)


def test_kernels_no_plain_name_reaches_are_warned_about(cache_dir):
    mangled = "__global__ void k(float* x) { x[0] = 1.0f; }"
    with pytest.warns(UserWarning, match=r"defines __global__ k but the program has only mangled names \(_Z1kPf\).*"
                                         r"extern \"C\".*name_expressions"):
        shimrt.compile(mangled, "sm_90")
    with pytest.warns(UserWarning, match="defines __global__ fill, scale but the program has only mangled names"):
        shimrt.compile(TEMPLATE, "sm_90")  # the template yields nothing; ns::fill is mangled
    with pytest.warns(UserWarning, match="defines __global__ t but the program has no kernel at all"):
        shimrt.compile("template <int N> __global__ void t(int* x) { x[0] = N; }", "sm_90")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # reachable kernels: nothing to say
        shimrt.compile('extern "C" __global__ void k(float* x) { x[0] = 1.0f; }', "sm_90")
        shimrt.compile(mangled, "sm_90", name_expressions=["k"])
        shimrt.compile("// __global__ void old(float*);\n" + 'extern "C" __global__ void k(float* x) {}', "sm_90")
