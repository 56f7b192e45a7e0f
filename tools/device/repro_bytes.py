import sys, os, importlib, torch
sys.path.insert(0, "tests")
import test_cuda_compressed as T
from conftest import load_kernel
ms = load_kernel("cuda"); ops = importlib.import_module(ms.__name__ + "._ops").ops
surface, fmt, dt, dim, lq, ld, integer = sys.argv[1], sys.argv[2], getattr(torch, sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), sys.argv[7] == "1"
gen = torch.Generator().manual_seed(1)
case = T.Case(surface, fmt, dt, dim, lq, gen, integer=integer, ld=ld)
case.cuda_inputs()
s, a = case.forward(ops, True)
torch.cuda.synchronize()
T.check_forward(case, s, a)
print("OK", sys.argv[1:])
