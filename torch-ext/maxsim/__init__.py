"""maxsim: exact MaxSim (late-interaction scoring) without the [Lq, Ld] similarity matrix.

score(q, d) = sum_i max_j <q_i, d_j>, for padded reranking, ragged pair grids (packed)
and in-batch contrastive scoring (documents packed, or padded with lengths), each with
`_with_argmax` and autograd `_train` forms, plus pure-PyTorch references; documents stored
compressed (int8 / float8 e4m3fn with per-token scales: `quantize_documents`, then
`document_scales=` on any entry point) or as ColBERTv2 / PLAID residual codes (uint8
documents with `document_codes=` and `residual_codec=maxsim.ResidualCodec(...)`); helpers for
several processes on torch.distributed (`maxsim.distributed`: gathered in-batch negatives,
sharded top-k search); and `maxsim.compat`, drop-in adapters for PyLate and colpali-engine
with the switches that route those libraries through maxsim (`patch_pylate`, ...).
"""
from . import compat
from ._api import (
    score_centroids,
    score_candidates_padded,
    score_candidates_padded_train,
    score_candidates_padded_with_argmax,
    score_contrastive,
    score_contrastive_padded,
    score_contrastive_padded_train,
    score_contrastive_padded_with_argmax,
    score_contrastive_train,
    score_contrastive_with_argmax,
    score_pairs_packed,
    score_pairs_packed_train,
    score_pairs_packed_with_argmax,
)
from ._quantize import dequantize_documents, quantize_documents
from ._residual import ResidualCodec, compress_residuals, decompress_residuals, score_centroids_reference
from . import distributed
from .distributed import gather_documents, score_contrastive_train_global, search_sharded
from .compat import (
    patch_colpali_engine,
    patch_pylate,
    unpatch_colpali_engine,
    unpatch_pylate,
)
from ._reference import (
    maxsim_reference,
    score_candidates_padded_backward_reference,
    score_candidates_padded_reference,
    score_candidates_padded_with_argmax_reference,
    score_contrastive_backward_reference,
    score_contrastive_padded_backward_reference,
    score_contrastive_padded_reference,
    score_contrastive_padded_with_argmax_reference,
    score_contrastive_reference,
    score_contrastive_with_argmax_reference,
    score_pairs_packed_backward_reference,
    score_pairs_packed_reference,
    score_pairs_packed_with_argmax_reference,
)

__all__ = [
    "ResidualCodec",
    "compat",
    "compress_residuals",
    "decompress_residuals",
    "dequantize_documents",
    "distributed",
    "gather_documents",
    "patch_colpali_engine",
    "patch_pylate",
    "quantize_documents",
    "unpatch_colpali_engine",
    "unpatch_pylate",
    "maxsim_reference",
    "score_candidates_padded",
    "score_centroids",
    "score_centroids_reference",
    "score_candidates_padded_backward_reference",
    "score_candidates_padded_reference",
    "score_candidates_padded_train",
    "score_candidates_padded_with_argmax",
    "score_candidates_padded_with_argmax_reference",
    "score_contrastive",
    "score_contrastive_backward_reference",
    "score_contrastive_padded",
    "score_contrastive_padded_backward_reference",
    "score_contrastive_padded_reference",
    "score_contrastive_padded_train",
    "score_contrastive_padded_with_argmax",
    "score_contrastive_padded_with_argmax_reference",
    "score_contrastive_reference",
    "score_contrastive_train",
    "score_contrastive_train_global",
    "score_contrastive_with_argmax",
    "score_contrastive_with_argmax_reference",
    "score_pairs_packed",
    "score_pairs_packed_backward_reference",
    "score_pairs_packed_reference",
    "score_pairs_packed_train",
    "score_pairs_packed_with_argmax",
    "score_pairs_packed_with_argmax_reference",
    "search_sharded",
]
