"""tools/sass_loops.py's readers, on SASS and ptxas text written here (no compiler needed)."""
from __future__ import annotations

from conftest import REPO_ROOT, _load_source_module

SASS_LOOPS = _load_source_module("maxsim_sass_loops", REPO_ROOT / "tools" / "sass_loops.py")

# Two kernels: the first has an outer loop (0x0040 .. 0x00e0) around an inner FMA loop
# (0x0060 .. 0x00b0) and a loop without FMAs; the second has no loop.
SASS = """
	code for sm_90a
		Function : _Z5outerv
	.headerflags	@"EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   IMAD.MOV.U32 R2, RZ, RZ, RZ ;
        /*0040*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0050*/                   IMAD.MOV.U32 R3, RZ, RZ, RZ ;
        /*0060*/                   LDS.128 R4, [R8] ;
        /*0070*/                   FFMA R10, R4, R5, R10 ;
        /*0080*/              @P1  FFMA R11, R6, R7, R11 ;
        /*0090*/                   VIADD R3, R3, 0x1 ;
        /*00a0*/                   ISETP.NE.AND P0, PT, R3, 0x8, PT ;
        /*00b0*/               @P0 BRA 0x60 ;
        /*00c0*/                   VIADD R2, R2, 0x1 ;
        /*00d0*/                   ISETP.NE.AND P0, PT, R2, 0x4, PT ;
        /*00e0*/               @P0 BRA 0x40 ;
        /*00f0*/                   IADD3 R12, R12, 0x1, RZ ;
        /*0100*/                   ISETP.NE.AND P2, PT, R12, 0x4, PT ;
        /*0110*/              @!P2 BRA P3, 0xf0 ;
        /*0120*/                   EXIT ;
		..........
		Function : _Z4flatv
        /*0000*/                   DFMA R2, R4, R6, R2 ;
        /*0010*/                   EXIT ;
		..........
"""

PTXAS = """ptxas info    : Compiling entry function '_Z5outerv' for 'sm_90a'
ptxas info    : Function properties for _Z5outerv
    16 bytes stack frame, 12 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 128 registers, used 1 barriers, 16 bytes cumulative stack size
ptxas info    : Compiling entry function '_Z4flatv' for 'sm_90a'
ptxas info    : Function properties for _Z4flatv
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers
"""


def test_innermost_fma_loops_counts_only_the_inner_loop_with_fmas():
    loops = SASS_LOOPS.innermost_fma_loops(SASS)
    # the inner loop: LDS, 2 FFMA (one predicated), VIADD, ISETP, BRA; the outer loop holds it,
    # and the loop at 0xf0 has no FMA
    assert loops == {"_Z5outerv": [(6, 2, 1)], "_Z4flatv": []}


def test_ptxas_usage_reads_registers_and_spills_per_kernel():
    assert SASS_LOOPS.ptxas_usage(PTXAS) == {"_Z5outerv": (128, 12), "_Z4flatv": (8, 0)}
