"""A small CUDA workload for compute-sanitizer: every public entry point once, per dtype,
on ragged inputs with odd sizes (partial tiles), empty segments and a bad pair id, with float
documents, with int8 / float8 ones and with residual (ColBERTv2) codes including bad codes; then the
half-precision padded and packed calls again with the sm_90a kernel forced on them (by
default it takes only long documents, many steps or dim > 128), in each of its strided shapes; the sm_90a
kernel for compressed documents forced, in each of its tile shapes and with runs of several
steps a CTA (a query loaded once a run); then every
gradient again with grad_documents' sorted kernel forced (by default it takes only documents
with many entries a row), plus a contrastive step whose documents take several batches of it.

    compute-sanitizer --tool memcheck  python3 tools/device/sanitize_subset.py
    compute-sanitizer --tool racecheck python3 tools/device/sanitize_subset.py

SANITIZE_PARTS=residual (comma-separated: float, compressed, residual, residual_ffma, hopper, centroids, bytes,
grad_documents, grad_documents_sorted: its sorted kernels at two types and dims) runs only those.
"""
import os
from pathlib import Path

import kernels
import torch

ROOT = Path(__file__).resolve().parents[2]
maxsim = kernels.get_local_kernel(ROOT)
dev = "cuda"
gen = torch.Generator(device="cpu").manual_seed(0)


def rand(*shape, dtype):
    return torch.randn(*shape, generator=gen).to(dtype).to(dev)


def every_entry_point(dtype, dim):
    b, c, lq, ld = 3, 5, 37, 141
    q, d = rand(b, lq, dim, dtype=dtype), rand(b, c, ld, dim, dtype=dtype)
    ql = torch.tensor([lq, 0, 17], device=dev)
    dl = torch.randint(0, ld + 1, (b, c), generator=gen).to(dev)
    dl[0, 0] = 0
    q.requires_grad_(), d.requires_grad_()
    maxsim.score_candidates_padded(q, d, ql, dl)
    maxsim.score_candidates_padded_with_argmax(q, d, ql, dl)
    maxsim.score_candidates_padded_train(q, d, ql, dl).sum().backward()

    doc_lens = torch.tensor([0, 5, 141, 64, 1])
    offs = torch.cat([torch.zeros(1, dtype=torch.long), doc_lens.cumsum(0)]).to(dev)
    docs = rand(int(doc_lens.sum()), dim, dtype=dtype).requires_grad_()
    cq = rand(4, lq, dim, dtype=dtype).requires_grad_()
    cql = torch.tensor([lq, 1, 0, 20], device=dev)
    maxsim.score_contrastive(cq, docs, offs, query_lengths=cql)
    maxsim.score_contrastive_train(cq, docs, offs, query_lengths=cql).sum().backward()

    pdocs = rand(5, ld, dim, dtype=dtype).requires_grad_()
    plens = torch.tensor([0, 5, ld, 64, 1], device=dev, dtype=torch.int32)
    maxsim.score_contrastive_padded_with_argmax(cq, pdocs, plens, query_lengths=cql)
    maxsim.score_contrastive_padded_train(cq, pdocs, plens, query_lengths=cql).sum().backward()

    q_lens = torch.tensor([7, 0, 300, 33])
    qoffs = torch.cat([torch.zeros(1, dtype=torch.long), q_lens.cumsum(0)]).to(dev)
    pq_tok = rand(int(q_lens.sum()), dim, dtype=dtype).requires_grad_()
    pq = torch.tensor([0, 1, 2, 3, 2, 0, 3], device=dev, dtype=torch.int32)
    pd = torch.tensor([1, 2, 2, 0, 4, 3, 4], device=dev, dtype=torch.int32)
    maxsim.score_pairs_packed(pq_tok, qoffs, docs, offs, pq, pd)
    maxsim.score_pairs_packed_train(pq_tok, qoffs, docs, offs, pq, pd, max_q_len=300).sum().backward()
    bad = pd.clone()
    bad[2] = 99  # out of range: NaN score, no access
    s = maxsim.score_pairs_packed(pq_tok, qoffs, docs, offs, pq, bad)
    assert torch.isnan(s[2]), s
    maxsim.score_pairs_packed_with_argmax(pq_tok, qoffs, docs, offs, pq, bad, max_q_len=300)


def compressed_entry_points(dtype, dim, fmt, lq=37):
    """Every surface with int8 / float8 documents (one scale per token), query gradients."""
    b, c, ld = 3, 5, 141
    q = rand(b, lq, dim, dtype=dtype).requires_grad_()
    v, s = maxsim.quantize_documents(rand(b, c, ld, dim, dtype=torch.float32), fmt)
    ql = torch.tensor([lq, 0, 17], device=dev)
    dl = torch.randint(0, ld + 1, (b, c), generator=gen).to(dev)
    dl[0, 0] = 0
    maxsim.score_candidates_padded_with_argmax(q, v, ql, dl, document_scales=s)
    maxsim.score_candidates_padded_train(q, v, ql, dl, document_scales=s).sum().backward()
    doc_lens = torch.tensor([0, 5, 141, 64, 1])
    offs = torch.cat([torch.zeros(1, dtype=torch.long), doc_lens.cumsum(0)]).to(dev)
    dv, ds = maxsim.quantize_documents(rand(int(doc_lens.sum()), dim, dtype=torch.float32), fmt)
    cq = rand(4, lq, dim, dtype=dtype).requires_grad_()
    cql = torch.tensor([lq, 1, 0, 20], device=dev)
    maxsim.score_contrastive_train(cq, dv, offs, query_lengths=cql, document_scales=ds).sum().backward()
    pv, ps = maxsim.quantize_documents(rand(5, ld, dim, dtype=torch.float32), fmt)
    plens = torch.tensor([0, 5, ld, 64, 1], device=dev, dtype=torch.int32)
    maxsim.score_contrastive_padded_train(cq, pv, plens, query_lengths=cql,
                                          document_scales=ps).sum().backward()
    q_lens = torch.tensor([7, 0, 300, 33] if lq > 32 else [7, 0, lq, 1])
    qoffs = torch.cat([torch.zeros(1, dtype=torch.long), q_lens.cumsum(0)]).to(dev)
    pq_tok = rand(int(q_lens.sum()), dim, dtype=dtype).requires_grad_()
    pq = torch.tensor([0, 1, 2, 3, 2, 0, 3], device=dev, dtype=torch.int32)
    pd = torch.tensor([1, 2, 2, 0, 4, 3, 99], device=dev, dtype=torch.int32)  # 99: out of range
    out = maxsim.score_pairs_packed_train(pq_tok, qoffs, dv, offs, pq, pd, max_q_len=int(q_lens.max()),
                                          document_scales=ds)
    assert torch.isnan(out[6]), out
    out[:6].sum().backward()


def residual_entry_points(dtype, dim, nbits, centroid_dtype=None):
    """Every surface with residual documents, query gradients, codes out of range (NaN, no
    access past the centroids). centroid_dtype other than dtype (or float32 queries, or dim >
    256): the FFMA route's decode."""
    n_cent = 19
    codec = maxsim.ResidualCodec(rand(n_cent, dim, dtype=centroid_dtype or dtype),
                                 rand(1 << nbits, dtype=torch.float32), nbits)
    rb = dim * nbits // 8

    def codes_and_bits(*tokens):
        codes = torch.randint(0, n_cent, tokens, generator=gen).to(dev)
        flat = codes.view(-1)
        if flat.numel() > 3:
            flat[1], flat[-1] = n_cent, -7  # out of range both ways
        return codes, torch.randint(0, 256, (*tokens, rb), generator=gen).to(torch.uint8).to(dev)

    b, c, lq, ld = 3, 5, 37, 141
    q = rand(b, lq, dim, dtype=dtype).requires_grad_()
    codes, bits = codes_and_bits(b, c, ld)
    ql = torch.tensor([lq, 0, 17], device=dev)
    dl = torch.randint(0, ld + 1, (b, c), generator=gen).to(dev)
    dl[0, 0] = 0
    kw = {"document_codes": codes, "residual_codec": codec}
    maxsim.score_candidates_padded_with_argmax(q, bits, ql, dl, **kw)
    maxsim.score_candidates_padded_train(q, bits, ql, dl, **kw).sum().backward()
    doc_lens = torch.tensor([0, 5, 141, 64, 1])
    offs = torch.cat([torch.zeros(1, dtype=torch.long), doc_lens.cumsum(0)]).to(dev)
    dcodes, dbits = codes_and_bits(int(doc_lens.sum()))
    dkw = {"document_codes": dcodes.int(), "residual_codec": codec}
    cq = rand(4, lq, dim, dtype=dtype).requires_grad_()
    cql = torch.tensor([lq, 1, 0, 20], device=dev)
    maxsim.score_contrastive_train(cq, dbits, offs, query_lengths=cql, **dkw).sum().backward()
    pcodes, pbits = codes_and_bits(5, ld)
    plens = torch.tensor([0, 5, ld, 64, 1], device=dev, dtype=torch.int32)
    maxsim.score_contrastive_padded_train(cq, pbits, plens, query_lengths=cql, document_codes=pcodes,
                                          residual_codec=codec).sum().backward()
    q_lens = torch.tensor([7, 0, 300, 33])
    qoffs = torch.cat([torch.zeros(1, dtype=torch.long), q_lens.cumsum(0)]).to(dev)
    pq_tok = rand(int(q_lens.sum()), dim, dtype=dtype).requires_grad_()
    pq = torch.tensor([0, 1, 2, 3, 2, 0, 3], device=dev, dtype=torch.int32)
    pd = torch.tensor([1, 2, 2, 0, 4, 3, 99], device=dev, dtype=torch.int32)  # 99: out of range
    out = maxsim.score_pairs_packed_train(pq_tok, qoffs, dbits, offs, pq, pd, max_q_len=300, **dkw)
    assert torch.isnan(out[6]), out
    out[:6].sum().backward()


def centroid_scores(query_dtype, centroid_dtype, lq):
    """score_centroids: both table routes (cuBLAS for one 16-bit dtype, the table kernel for the
    rest), the float4 and scalar gathers (lq 32 / 45), a document past one staged chunk, codes out
    of range both ways, bad pair ids and bad offsets (NaN, no access out of bounds)."""
    n_cent, dim = 300, 64
    cents = rand(n_cent, dim, dtype=centroid_dtype)
    q = rand(3, lq, dim, dtype=query_dtype)
    lens = torch.tensor([0, 1, 33, 1500, 300])
    offs = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)]).to(dev)
    codes = torch.randint(0, n_cent, (int(lens.sum()),), generator=gen).to(dev)
    codes[40], codes[-1] = n_cent, -3
    ql = torch.tensor([lq, 0, 7], device=dev)
    grid = maxsim.score_centroids(q, codes, offs, cents, query_lengths=ql)
    assert torch.isnan(grid[[0, 2], 3]).all() and torch.isnan(grid[[0, 2], 4]).all(), grid
    pq = torch.tensor([0, 2, 9, 1, -1], device=dev)
    pd = torch.tensor([3, 2, 1, 7, 0], device=dev)
    out = maxsim.score_centroids(q, codes.int(), offs, cents, pair_query_ids=pq, pair_document_ids=pd)
    assert torch.isnan(out[[2, 3, 4]]).all(), out
    bad_offs = offs.clone()
    bad_offs[2] = 10**9
    assert torch.isnan(maxsim.score_centroids(q, codes, bad_offs, cents)[:, 1:3]).all()


def many_entries_a_row(dtype, dim):
    """Contrastive training with 80 queries against short ragged documents: thousands of
    entries a document, so the sorted grad_documents kernel runs several batches a window."""
    doc_lens = torch.tensor([0, 1, 90, 7, 150, 33])
    offs = torch.cat([torch.zeros(1, dtype=torch.long), doc_lens.cumsum(0)]).to(dev)
    docs = rand(int(doc_lens.sum()), dim, dtype=dtype).requires_grad_()
    cq = rand(80, 37, dim, dtype=dtype).requires_grad_()
    cql = torch.randint(0, 38, (80,), generator=gen).to(dev)
    maxsim.score_contrastive_train(cq, docs, offs, query_lengths=cql).sum().backward()


parts = set(os.environ.get("SANITIZE_PARTS", "float,compressed,residual,residual_ffma,hopper,centroids,bytes,grad_documents")
            .split(","))
for dtype in (torch.float16, torch.bfloat16, torch.float32):
    for dim in (3, 128, 300):
        if "float" in parts:
            every_entry_point(dtype, dim)
        if "compressed" in parts:
            for fmt in ("int8", "float8_e4m3fn"):
                compressed_entry_points(dtype, dim, fmt)
if "residual" in parts:
    for dtype in (torch.float16, torch.bfloat16):
        for dim, nbits in ((8, 1), (64, 4), (128, 2), (256, 2)):
            residual_entry_points(dtype, dim, nbits)
if "residual_ffma" in parts:
    for dtype, centroid_dtype, dim, nbits in ((torch.float32, torch.float16, 8, 1), (torch.float32, torch.float32, 128, 2),
                                              (torch.bfloat16, torch.float16, 64, 4), (torch.float16, torch.float16, 272, 2)):
        residual_entry_points(dtype, dim, nbits, centroid_dtype)
if "centroids" in parts:
    for query_dtype, centroid_dtype in ((torch.float16, torch.float16), (torch.float32, torch.bfloat16)):
        for lq in (32, 45):
            centroid_scores(query_dtype, centroid_dtype, lq)
if "hopper" in parts:
    os.environ.update(MAXSIM_CUDA_HOPPER_PADDED="1", MAXSIM_CUDA_HOPPER_PACKED="1")
    # each CTA count with the query streamed beside every K-chunk and resident in two buffers,
    # the resident one also in runs of one step and of three (a query loaded once a run); three
    # CTAs an SM: 64-row tiles, streamed and resident (one query buffer)
    for ctas, resident, run in (("2", "0", "4"), ("1", "0", "4"), ("2", "1", "4"), ("1", "1", "4"),
                                ("2", "1", "1"), ("2", "1", "3"), ("3", "0", "4"), ("3", "1", "4"),
                                ("3", "1q2", "4"), ("3", "1q2", "1")):
        os.environ.update(MAXSIM_CUDA_HOPPER_PADDED_CTAS=ctas, MAXSIM_CUDA_HOPPER_RESIDENT=resident[0],
                          MAXSIM_CUDA_HOPPER_RUN=run, MAXSIM_CUDA_HOPPER_QUERY_BUFS="2" if "q2" in resident else "1")
        for dtype in (torch.float16, torch.bfloat16):
            every_entry_point(dtype, 128)
        if resident == "1" and ctas in ("1", "2") and run == "4":
            every_entry_point(torch.float16, 256)  # the 256-column resident shape of that CTA count
        if resident[0] == "1":  # more steps than CTA slots: runs of several steps, queries reused
            q, d = rand(4, 32, 128, dtype=torch.float16), rand(4, 300, 40, 128, dtype=torch.float16)
            qlen = torch.tensor([29, 0, 17, 32], device=dev)
            dlen = torch.randint(0, 41, (4, 300), generator=gen).to(dev)
            maxsim.score_candidates_padded_with_argmax(q, d, qlen, dlen)
            pq = torch.arange(6, device=dev).repeat_interleave(200) % 4
            maxsim.score_pairs_packed_with_argmax(
                rand(78, 128, dtype=torch.bfloat16), torch.tensor([0, 29, 29, 46, 78], device=dev),
                rand(300 * 40, 128, dtype=torch.bfloat16), torch.arange(0, 300 * 40 + 1, 40, device=dev),
                pq, torch.arange(1200, device=dev) % 300, max_q_len=32)
    for knob in ("MAXSIM_CUDA_HOPPER_RESIDENT", "MAXSIM_CUDA_HOPPER_RUN", "MAXSIM_CUDA_HOPPER_QUERY_BUFS"):
        os.environ.pop(knob)
if "bytes" in parts:
    # the sm_90a kernel for compressed documents, forced, in each of its Lq <= 32 tile shapes
    os.environ["MAXSIM_CUDA_HOPPER_BYTES"] = "1"
    for tile in ("128", "64"):
        os.environ["MAXSIM_CUDA_HOPPER_BYTES_TILE"] = tile
        for dtype in (torch.float16, torch.bfloat16):
            for fmt in ("int8", "float8_e4m3fn"):
                compressed_entry_points(dtype, 128, fmt, lq=29)
                # one packed query of 5 rows under max_q_len 32: its query box reaches past the tensor
                dv, ds = maxsim.quantize_documents(rand(400, 128, dtype=torch.float32), fmt)
                offs = torch.tensor([0, 150, 150, 400], device=dev)
                maxsim.score_pairs_packed_with_argmax(
                    rand(5, 128, dtype=dtype), torch.tensor([0, 5], device=dev), dv, offs,
                    torch.zeros(3, dtype=torch.int32, device=dev), torch.arange(3, device=dev), max_q_len=32,
                    document_scales=ds)
    os.environ.pop("MAXSIM_CUDA_HOPPER_BYTES_TILE")
    # Lq > 32 with each step's tiles split between two consumer warpgroups
    os.environ["MAXSIM_CUDA_HOPPER_BYTES_SPLIT"] = "1"
    for fmt in ("int8", "float8_e4m3fn"):
        compressed_entry_points(torch.float16, 128, fmt, lq=45)
        compressed_entry_points(torch.bfloat16, 128, fmt, lq=100)
    os.environ.pop("MAXSIM_CUDA_HOPPER_BYTES_SPLIT")
    # runs of several steps a CTA (more steps than CTA slots), one query load a run: a padded
    # grid of 4 queries x 300 ragged candidates, and 1,200 packed pairs in runs of one query
    dv, ds = maxsim.quantize_documents(rand(4, 300, 24, 128, dtype=torch.float32), "int8")
    qlen = torch.tensor([29, 0, 17, 32], device=dev)
    dlen = torch.randint(0, 25, (4, 300), device=dev)
    pdv, pds = maxsim.quantize_documents(rand(300 * 24, 128, dtype=torch.float32), "int8")
    poffs = torch.arange(0, 300 * 24 + 1, 24, device=dev)
    pq = torch.arange(6, device=dev).repeat_interleave(200) % 4
    for run in ("2", "5"):
        os.environ["MAXSIM_CUDA_HOPPER_BYTES_RUN"] = run
        for dtype in (torch.float16, torch.bfloat16):
            q = rand(4, 32, 128, dtype=dtype)
            maxsim.score_candidates_padded(q, dv, qlen, dlen, document_scales=ds)
            maxsim.score_candidates_padded_with_argmax(q, dv, qlen, dlen, document_scales=ds)
            qp = rand(78, 128, dtype=dtype)
            qoffs = torch.tensor([0, 29, 29, 46, 78], device=dev)
            maxsim.score_pairs_packed_with_argmax(qp, qoffs, pdv, poffs, pq, torch.arange(1200, device=dev) % 300,
                                                  max_q_len=32, document_scales=pds)
    os.environ.pop("MAXSIM_CUDA_HOPPER_BYTES_RUN")
    os.environ.pop("MAXSIM_CUDA_HOPPER_BYTES")
if "grad_documents" in parts or "grad_documents_sorted" in parts:
    for knob in ("MAXSIM_CUDA_HOPPER_PADDED", "MAXSIM_CUDA_HOPPER_PACKED", "MAXSIM_CUDA_HOPPER_PADDED_CTAS"):
        os.environ.pop(knob, None)  # the forward as by default
    # (sorted at 184 rows: the 192-row variant, one window for most documents; binned at 16
    # rows: the contrastive calls' hits binned by window first, long segments over several laps.)
    # grad_documents_sorted: the sorted kernels alone, at one 16-bit and one 32-bit type, one
    # dim of a column chunk and one of three (racecheck took over 230 s on the whole part).
    configs = (("sorted", "0", "0"), ("sorted", "184", "0"), ("sorted", "16", "1"), ("scan", "0", "0"))
    combos = [(dtype, dim) for dtype in (torch.float16, torch.float32, torch.float64) for dim in (3, 128, 300)]
    if "grad_documents" not in parts:
        configs, combos = configs[:3], [(torch.float16, 128), (torch.float32, 300)]
    for kernel, rows, binned in configs:
        os.environ["MAXSIM_CUDA_GRAD_D"] = kernel
        os.environ["MAXSIM_CUDA_GRAD_D_ROWS"] = rows
        os.environ["MAXSIM_CUDA_GRAD_D_BINNED"] = binned
        for dtype, dim in combos:
            every_entry_point(dtype, dim)
            many_entries_a_row(dtype, dim)
    os.environ.pop("MAXSIM_CUDA_GRAD_D")
    os.environ.pop("MAXSIM_CUDA_GRAD_D_ROWS")
    os.environ.pop("MAXSIM_CUDA_GRAD_D_BINNED")
torch.cuda.synchronize()
print("sanitize subset done")
