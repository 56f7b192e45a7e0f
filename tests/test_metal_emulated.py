"""The Metal backend's kernels (maxsim_metal/*.metal), run on the Linux MSL emulator
(tools/metal_emu/) against the float64 reference.

Every kernel launch here runs three times (threads in forward, reverse and random order;
threadgroup memory and outputs poisoned with two different patterns) and must give the
same bits each time (tests/metal_emulator.py). Under AddressSanitizer (.ci/metal.sh)
every buffer is exactly its tensor's size. What this cannot show: that Apple's compiler
accepts the source, Metal's fast-math numerics, the metallib embedding, the MPS glue
(maxsim_metal/ops.mm), speed. docs/metal.md says what is and is not proven. Compressed
(int8 / float8 e4m3fn) documents: tests/test_metal_emulated_compressed.py.
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import (
    INDEX_DTYPES, SURFACES, ContrastivePadded, Packed, as_padded_documents, assert_argmax,
    assert_grads, assert_scores, expected_grads, ids, lattice, make_case, make_contrastive,
    make_packed, make_padded, run_train, unit,
)
import metal_emulator as emu

# The emulator's fibers are glibc ucontext; on macOS the suite runs on the real GPU instead.
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the MSL emulator runs on Linux")

REPO = Path(__file__).resolve().parent.parent
METAL = REPO / "maxsim_metal"
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
LENGTHS = (0, 1, 7, 8, 9, 33)  # empty, single, around one 8-row tile, past one 32-row chunk
DIMS = (1, 3, 8, 64, 100, 128, 256, 300)


@pytest.fixture(scope="module")
def ms():
    return emu.EmulatedMaxsim()


def bits(t):
    return emu._bits(t)


def check_forward(ms, case, *, exact=False):
    """Both forms against the reference; the argmax-free scores are the same bits."""
    expected, _ = case.reference()
    scores, argmax = case.call(ms, "_with_argmax")
    assert_scores(scores, case, expected, exact=exact)
    assert_argmax(argmax, case, exact=exact)
    assert torch.equal(bits(case.call(ms, "")), bits(scores))
    return scores, argmax


def check_backward(ms, case, scores, argmax, gen):
    grad_scores = torch.randn(scores.shape, generator=gen, dtype=torch.float64).float()
    gq, gd = ms.backward(case, grad_scores, argmax)
    eq, ed, bq, bd = expected_grads(case, grad_scores, argmax)
    assert_grads(gq, eq, bq, case.queries.dtype)
    assert_grads(gd, ed, bd, case.documents.dtype)
    return gq, gd


def check_all(ms, case, gen, *, exact=False):
    scores, argmax = check_forward(ms, case, exact=exact)
    return (scores, argmax) + check_backward(ms, case, scores, argmax, gen)


# ---- every surface, dtype and index width ---------------------------------------------------

@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("surface", SURFACES)
def test_surfaces(ms, surface, dtype, index_dtype, rng):
    case = make_case(surface, rng, n=3, Lq=37, Ld=41, D=20, dtype=dtype, index_dtype=index_dtype)
    check_all(ms, case, rng)


@pytest.mark.parametrize("surface", SURFACES)
def test_index_widths_give_identical_bits(ms, surface, rng):
    case = make_case(surface, rng, n=3, Lq=12, Ld=35, D=24)
    narrow = case.__class__(**{
        k: (v.to(torch.int32) if isinstance(v, torch.Tensor) and not v.is_floating_point() else v)
        for k, v in vars(case).items()})
    g = torch.rand(case.score_shape, generator=rng) + 0.5
    outs = []
    for c in (case, narrow):
        s, a = c.call(ms, "_with_argmax")
        outs.append((s, a) + ms.backward(c, g, a))
    for x, y in zip(*outs):
        assert torch.equal(bits(x), bits(y))


@pytest.mark.parametrize("surface", SURFACES)
def test_train_forms(ms, surface, rng):
    """`_train` scores are the forward's bits; autograd's gradients are the kernels'."""
    case = make_case(surface, rng, n=3, Lq=11, Ld=14, D=24, dtype=torch.float16)
    g = unit(rng, *case.score_shape)  # mixed signs
    scores, gq, gd = run_train(ms, case, g)
    ref_scores, argmax = case.call(ms, "_with_argmax")
    assert torch.equal(bits(scores.detach()), bits(ref_scores))
    eq, ed, bq, bd = expected_grads(case, g, argmax)
    assert_grads(gq, eq, bq, case.queries.dtype)
    assert_grads(gd, ed, bd, case.documents.dtype)
    assert gq.abs().sum() > 0 and gd.abs().sum() > 0


# ---- lengths, dims, long rows -----------------------------------------------------------------

@pytest.mark.parametrize("surface", SURFACES)
def test_lengths(ms, surface, rng):
    """Every (query length, document length) in LENGTHS x LENGTHS."""
    n, top = len(LENGTHS), max(LENGTHS)
    if surface == "padded":
        case = make_padded(rng, n, n, top, top, 8, q_lens=list(LENGTHS),
                           d_lens=[list(LENGTHS)] * n)
    elif surface in ("contrastive", "contrastive_padded"):
        case = make_contrastive(rng, n, top, list(LENGTHS), 8, q_lens=list(LENGTHS))
        if surface == "contrastive_padded":
            case = as_padded_documents(case)
    else:
        case = make_packed(rng, list(LENGTHS), list(LENGTHS), 8)
    check_all(ms, case, rng)


@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("surface,dtype", [("padded", torch.float32), ("packed", torch.float16),
                                           ("contrastive", torch.bfloat16),
                                           ("contrastive_padded", torch.float32)])
def test_dims(ms, surface, dtype, dim, rng):
    """dim is zero-filled to a multiple of 8 and staged 32 columns at a time."""
    case = make_case(surface, rng, n=2, Lq=10, Ld=12, D=dim, dtype=dtype)
    check_all(ms, case, rng)


def test_long_queries(ms, rng):
    """Lq = 300: ten 32-row chunks, the last one partial."""
    case = make_contrastive(rng, 1, 300, [203, 37], 64, dtype=torch.float16, q_lens=[300])
    check_all(ms, case, rng)


def test_long_document(ms, rng):
    """Ld = 2000: 63 document tiles streamed through threadgroup memory."""
    case = make_padded(rng, 1, 1, 9, 2000, 64, q_lens=[9], d_lens=[[2000]])
    check_all(ms, case, rng)


def test_empty_and_zero_dim(ms, rng):
    for case in (make_padded(rng, 2, 2, 5, 4, 0),                  # D == 0: every max is 0
                 make_packed(rng, [3, 0], [2, 4], 16, pairs=[]),    # no pairs
                 make_padded(rng, 0, 3, 5, 4, 16),                 # B == 0
                 make_contrastive(rng, 2, 6, [], 16)):              # no documents
        check_all(ms, case, rng)


def test_max_q_len_wider_than_queries(ms, rng):
    case = make_packed(rng, [5, 9], [7, 3], 16, n_pairs=5, max_q_len=14)
    check_all(ms, case, rng)


# ---- values: NaN / inf, exact ties ------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("surface", SURFACES)
def test_nan_and_inf(ms, surface, dtype, rng):
    """NaN wins like torch.max (first NaN's index); infinities propagate exactly."""
    case = make_case(surface, rng, n=3, Lq=10, Ld=40, D=16, dtype=dtype)
    q, d = case.flat()
    d[1, 3] = float("nan")                       # one NaN similarity column
    d[min(5, d.shape[0] - 1), 0] = float("inf")  # +-inf similarities
    q[2, :] = float("nan")                       # a whole NaN query row
    q[0, 7] = float("-inf")
    scores, argmax = check_forward(ms, case)
    assert torch.isnan(scores).any()


@pytest.mark.parametrize("surface", SURFACES)
def test_ties_exact(ms, surface, rng):
    """Lattice values: every similarity exact, ties everywhere; lowest index must win, and
    scores must equal the reference bit for bit."""
    case = make_case(surface, rng, n=3, Lq=19, Ld=45, D=12, values=lattice)
    q, d = case.flat()
    d[3::4] = d[1]  # forced ties with row 1 across tiles, on top of the lattice's own
    check_forward(ms, case, exact=True)


# ---- bad values: clamped lengths, out-of-range offsets / ids ----------------------------------

def test_padded_lengths_are_clamped(ms, rng):
    case = make_padded(rng, 2, 2, 9, 11, 16, q_lens=[-3, 50], d_lens=[[40, -1], [11, 4]])
    check_all(ms, case, rng)


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_contrastive_padded_lengths_are_clamped(ms, index_dtype, rng):
    """Document lengths past Ld count as Ld, negative ones as 0 (as on CPU and CUDA)."""
    case = as_padded_documents(make_contrastive(rng, 3, 9, [11, 0, 4], 16, index_dtype=index_dtype))
    case.document_lengths = ids([40, -3, 4], index_dtype)
    clamped = ContrastivePadded(case.queries, case.documents, ids([11, 0, 4], index_dtype), case.query_lengths)
    outs = []
    for c in (case, clamped):
        s, a = check_all(ms, c, rng)[:2]
        g = torch.rand(c.score_shape, generator=torch.Generator().manual_seed(5)) + 0.5
        outs.append((s, a) + ms.backward(c, g, a))
    for x, y in zip(*outs):
        assert torch.equal(bits(x), bits(y))


def _nan_rows(scores, argmax, bad):
    bad = torch.as_tensor(bad)
    assert torch.isnan(scores.reshape(-1)[bad]).all()
    assert (argmax.reshape(scores.numel(), -1)[bad] == -1).all()


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_packed_bad_ids_and_offsets(ms, index_dtype, rng):
    """Bad pairs get NaN and argmax -1 and give no gradient; the good ones are unaffected."""
    q_lens, d_lens = [5, 9, 4], [7, 3, 6]
    pairs = [(0, 0), (3, 1), (-1, 0), (1, 3), (2, -5), (1, 2), (2, 1), (0, 1 << 20)]
    good = [0, 5, 6]
    case = make_packed(rng, q_lens, d_lens, 16, pairs=pairs, index_dtype=index_dtype, max_q_len=9)
    scores, argmax = case.call(ms, "_with_argmax")
    _nan_rows(scores, argmax, [p for p in range(len(pairs)) if p not in good])
    ref = make_packed(rng, q_lens, d_lens, 16, pairs=[pairs[p] for p in good], max_q_len=9)
    ref = Packed(case.queries, ref.query_offsets, case.documents, ref.document_offsets,
                 ref.pair_query_ids, ref.pair_document_ids, 9)
    good_t = torch.tensor(good)
    assert torch.equal(bits(scores[good_t]), bits(ref.call(ms, "")))
    g = torch.rand(len(pairs), generator=rng) + 0.5
    gq, gd = ms.backward(case, g, argmax)
    rq, rd = ms.backward(ref, g[good_t], argmax[good_t])
    assert torch.equal(bits(gq), bits(rq)) and torch.equal(bits(gd), bits(rd))


def test_packed_bad_offsets(ms, rng):
    """Decreasing and past-the-end offsets: those segments' pairs are bad."""
    case = make_packed(rng, [5, 9], [7, 3, 6], 16)  # all 6 pairs
    case.document_offsets = ids([0, 7, 5, 40])      # doc 1: 7 > 5, doc 2: 5 .. 40 > Td
    case.query_offsets = ids([0, 5, 14])
    scores, argmax = case.call(ms, "_with_argmax")
    _nan_rows(scores, argmax, [1, 2, 4, 5])
    assert not torch.isnan(scores[torch.tensor([0, 3])]).any()
    ms.backward(case, torch.ones(6), argmax)  # must not touch memory it does not own


def test_contrastive_bad_offsets(ms, rng):
    case = make_contrastive(rng, 2, 6, [5, 4, 3], 16, q_lens=None)
    case.document_offsets = ids([0, 5, 3, 100])  # doc 1 decreasing, doc 2 past T
    scores, argmax = case.call(ms, "_with_argmax")
    _nan_rows(scores, argmax, [1, 2, 4, 5])
    good = make_contrastive(rng, 2, 6, [5], 16, q_lens=None)
    good = good.with_qd(case.queries, case.documents[:5])
    assert torch.equal(bits(scores[:, 0]), bits(good.call(ms, "")[:, 0]))
    ms.backward(case, torch.ones(2, 3), argmax)


# ---- the launch plan ----------------------------------------------------------------------------

def _plan(ms, surface, sizes, dim, idx, *, backward=False, to_query=False, dtype=torch.float32,
          doc_format=0):
    """The launch plan's numbers, and its pipeline name under "kernel"."""
    out = (ctypes.c_int64 * 6)()
    name = ctypes.create_string_buffer(256)
    keep = []
    arr = (emu.EmuIndex * 4)(*[ms._index(t, keep) for t in idx])
    ms.lib.emu_plan(emu.SURFACE_IDS[surface], emu.DTYPE_IDS[dtype], doc_format, int(backward),
                    int(to_query), (ctypes.c_int64 * 4)(*sizes), ctypes.c_int64(dim), arr, out, name, 256)
    plan = dict(zip(("groups_x", "groups_y", "threads", "bytes", "run", "zero"), list(out)))
    return plan | {"kernel": name.value.decode()}


def test_launch_plan(ms):
    fwd = _plan(ms, "padded", [3, 4, 9, 13], 64, [ids([1, 2, 3]), ids([1] * 12), None, None])
    assert fwd == {"groups_x": 12, "groups_y": 1, "threads": 128, "bytes": (3 * 1024 + 2 * 32) * 4,
                   "run": 1, "zero": 0, "kernel": "maxsim_forward_padded_float"}
    assert fwd["bytes"] % 16 == 0 and fwd["bytes"] <= 32 * 1024  # Metal's limit and granularity
    gq = _plan(ms, "padded", [3, 4, 40, 13], 64, [ids([1, 2, 3]), ids([1] * 12), None, None],
               backward=True, to_query=True)
    assert (gq["groups_x"], gq["groups_y"], gq["zero"]) == (3, 3, 0)
    assert gq["bytes"] % 16 == 0 and gq["bytes"] <= 32 * 1024
    gd = _plan(ms, "contrastive", [2, 5, 30, 0], 8, [ids([0, 10, 30]), None, None, None],
               backward=True)
    assert (gd["groups_x"], gd["groups_y"], gd["zero"]) == (2, 1, 1)
    # padded documents tile grad_documents like padded candidates: no zero fill needed
    gp = _plan(ms, "contrastive_padded", [2, 5, 3, 40], 8, [ids([40, 0, 7]), None, None, None],
               backward=True)
    assert (gp["groups_x"], gp["groups_y"], gp["zero"]) == (3, 3, 0)
    empty = _plan(ms, "packed", [4, 4, 3, 0], 8, [ids([0, 4]), ids([0, 4]), ids([]), ids([])])
    assert empty["run"] == 0


# ---- the buffer slots: .metal attributes == launch plan enums == what ops.mm binds -------------

def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def _kernel_slots(source: str, kernel: str) -> dict[str, int]:
    m = re.search(rf"kernel\s+void\s+{kernel}\s*\((.*?)\)\s*\{{", source, re.S)
    return {name: int(slot) for name, slot in
            re.findall(r"(\w+)\s*\[\[buffer\((\d+)\)\]\]", m.group(1))}


def test_buffer_slots_match():
    plan = (METAL / "launch_plan.h").read_text()
    enums = {name: int(v) for name, v in re.findall(r"\b(k(?:Forward|Backward|Centroid)\w+) = (\d+)", plan)}
    mm = re.sub(r"//[^\n]*", "", (METAL / "ops.mm").read_text())
    literal = re.findall(r"set(?:Buffer|Bytes):[^\]]*atIndex:\d", mm)
    assert not literal, f"ops.mm must bind buffers through the plan's slot enums: {literal}"
    bound = set(re.findall(r"slots\[(k\w+)\] = binding\(", mm)) | set(re.findall(r"atIndex:(k\w+)", mm))
    if "kForwardParams" in bound and "kBackwardParams == 0" in mm:  # one encode() for all
        bound.add("kBackwardParams")
    if "kForwardParams" in bound and "kCentroidParams == 0" in mm:
        bound.add("kCentroidParams")
    for file, kernel, prefix in (("forward.metal", "maxsim_forward", "kForward"),
                                 ("backward.metal", "maxsim_backward", "kBackward"),
                                 ("centroid.metal", "maxsim_centroid_scores", "kCentroid")):
        slots = _kernel_slots((METAL / file).read_text(), kernel)
        assert slots, kernel
        plan_slots = {k: v for k, v in enums.items() if k.startswith(prefix) and k != prefix + "Slots"}
        expected = {prefix + _camel(name): slot for name, slot in slots.items()}
        assert plan_slots == expected, f"{kernel}: [[buffer(n)]] {expected} vs launch_plan.h {plan_slots}"
        assert enums[prefix + "Slots"] == max(slots.values()) + 1
        missing = set(expected) - bound
        assert not missing, f"ops.mm never binds {sorted(missing)}"
        assert f"Binding slots[{prefix}Slots]" in mm


# ---- the emulator catches what hardware would not forgive --------------------------------------

def _launch(ms, kernel, threads=128, tg_bytes=0, order=emu.FORWARD):
    out = torch.zeros(threads, dtype=torch.float32)
    bufs = (ctypes.c_void_p * 1)(out.data_ptr())
    err = ctypes.create_string_buffer(2048)
    opts = emu.EmuOptions(order, 7, emu.POISON_A, 0)
    rc = ms.lib.emu_launch(kernel.encode(), 1, threads, tg_bytes, bufs, 1, ctypes.byref(opts), err, 2048)
    return rc, err.value.decode(), out


def test_emulator_reports_divergent_barrier(ms):
    rc, err, _ = _launch(ms, "divergent_barrier")
    assert rc == 1 and "deadlock" in err and "threadgroup_barrier" in err, err


def test_emulator_reports_divergent_simd_call(ms):
    rc, err, _ = _launch(ms, "divergent_shuffle")
    assert rc == 1 and ("divergent" in err or "deadlock" in err), err


@pytest.mark.parametrize("kernel,tg_bytes", [("missing_barrier", 128 * 4), ("lockstep_reliance", 4 * 64 * 4)])
def test_emulator_exposes_missing_barriers(ms, kernel, tg_bytes):
    results = [_launch(ms, kernel, tg_bytes=tg_bytes, order=o) for o in (emu.FORWARD, emu.REVERSE, emu.RANDOM)]
    assert all(rc == 0 for rc, _, _ in results)
    assert not all(torch.equal(bits(results[0][2]), bits(r[2])) for r in results[1:])


def _mutant(tmp_path, name, file, old, new):
    return emu.mutant(tmp_path, name, [(file, old, new)])


@pytest.mark.parametrize("mutation", ["staging barrier removed", "simdgroup barrier removed",
                                      "tile bound shifted", "backward barrier removed"])
def test_suite_catches_kernel_mutations(tmp_path, mutation, rng):
    """A needed barrier removed or a tile bound off by one must fail the checks above."""
    file, old, new = {
        "staging barrier removed": (
            "forward.metal", "        threadgroup_barrier(mem_flags::mem_threadgroup);\n        const int kc",
            "        const int kc"),
        "simdgroup barrier removed": (
            "forward.metal", "simdgroup_barrier(mem_flags::mem_threadgroup);\n      Best cand",
            "\n      Best cand"),
        "tile bound shifted": ("forward.metal", "if (long(c) >= drows) break;", "if (long(c) > drows) break;"),
        "backward barrier removed": (
            "backward.metal", "threadgroup_barrier(mem_flags::mem_threadgroup);  // the hit slots", "//"),
    }[mutation]
    mutant = _mutant(tmp_path, mutation.replace(" ", "_"), file, old, new)
    # LENGTHS x LENGTHS; grad_documents has 6 x 33 entries per document: two 128-entry batches
    case = make_contrastive(rng, len(LENGTHS), 33, list(LENGTHS), 20, q_lens=list(LENGTHS))
    with pytest.raises(AssertionError) as failure:
        check_all(mutant, case, rng)
    print(f"{mutation}: {str(failure.value).splitlines()[0]}")


# ---- ThreadSanitizer: every entry point on real threads ---------------------------------------

@pytest.mark.skipif(os.environ.get("MAXSIM_METAL_SKIP_TSAN") == "1", reason="MAXSIM_METAL_SKIP_TSAN=1")
def test_thread_sanitizer():
    binary = emu.build("tsan")
    env = dict(os.environ, TSAN_OPTIONS="halt_on_error=1 exitcode=66")
    env.pop("LD_PRELOAD", None)
    r = subprocess.run([str(binary)], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0 and "ThreadSanitizer" not in r.stderr, r.stdout + r.stderr[-4000:]
    assert "PASSED (0 failures)" in r.stdout


# ---- the Python layer: float64 has no Metal type -------------------------------------------

def test_float64_rejected_off_cpu_and_cuda():
    """MPS tensors cannot be made here; the meta device takes the same branch."""
    spec = importlib.util.spec_from_file_location("validate_src", REPO / "torch-ext" / "maxsim" / "_validate.py")
    validate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(validate)
    validate.embeddings("queries", torch.empty(2, 3, 4, device="meta"), 3, "[B, Lq, D]")
    with pytest.raises(TypeError, match="queries is float64.*CPU and CUDA only"):
        validate.embeddings("queries", torch.empty(2, 3, 4, dtype=torch.float64, device="meta"), 3, "[B, Lq, D]")
