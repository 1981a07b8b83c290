"""Named barrier ids of the SM90 kernels (bar.sync / bar.arrive; 16 per CTA, 0 is
__syncthreads), one enum per kernel. A member with a range takes an offset (id = member + i).
Plain Python: no DSL imports."""

from enum import IntEnum


class NamedBarrierFwd(IntEnum):
    """sm90/fwd.py, FlashFwdSm90."""

    EPILOGUE = 1  # consumers + the store warp (warp 4): O in smem, the TMA store may read it
    PINGPONG = 2  # 2, 3, 4 (+ WG i): "consumer WG i may issue its GEMMs"
    CONSUMERS = 8  # all consumer threads (epilogue hand-offs between persistent tiles)


class NamedBarrierBwd(IntEnum):
    """sm90/bwd.py, FlashBwdSm90: DS and EPILOGUE among the 256 consumer threads; DQ_EMPTY and
    DQ_FULL (dq_reduce="bulk") between dQ warpgroup w and producer warp 1 (128 + 32 threads);
    DQ_ORDER (deterministic with dq_reduce="red") among the dQ threads; DQ_FULL_STAGE in place of
    DQ_FULL in the deterministic build with dq_smem="qdo"."""

    DS = 1  # dS^T of this query block written to smem (2 buffers)
    EPILOGUE = 2  # K and V buffers free for dK / dV; dK / dV in smem
    DQ_EMPTY = 3  # 3, 4 (+ w): the smem dQ buffer of warpgroup w has been read by the last bulk reduce
    DQ_FULL = 5  # 5, 6 (+ w): warpgroup w's dQ is in smem
    DQ_ORDER = 7  # the query block's dQ turn has come (before the REDs); the REDs are issued (after)
    # 8 + w * stages + stage (up to 15): DQ_FULL of warpgroup w for the blocks of one Q / dO stage
    # (deterministic, dq_smem="qdo": a warpgroup may arrive for the next block while warp 1 still
    # waits at this one, so consecutive blocks must not share a barrier; see FlashBwdSm90._dq_full_id)
    DQ_FULL_STAGE = 8
