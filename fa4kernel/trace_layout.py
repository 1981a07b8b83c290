"""Stamps buffer of the instrumented SM90 build (KernelConfig.trace). Plain Python."""

# Instrumented build (KernelConfig.trace): clock64 stamps of one CTA in an int64 buffer.
# header: [0] CTA to trace (written by the host), [1] clock64 and [2] globaltimer (ns) at kernel
# start (thread 0), [3] clock64 and [4] globaltimer at the end (warp 4 lane 0, after the last O
# store), [5] gridDim.x; [6] clock64 cycles, [7] globaltimer ns and [8] spans summed over every
# launch since the host last zeroed them (the traced CTA's start to end; in a CTA-log build every
# logged CTA's): SUM_CYCLES / SUM_NS is the mean in-kernel clock over all those launches, not
# one launch's sample. Then (start, end) pairs at
#   TRACE_HEADER + ((((role * TRACE_TILES + local_tile) * TRACE_ITERS + iter) * TRACE_OPS + op) * 2
# role 0 = producer, 1 + w = consumer WG w, 1 + num_wg = epilogue (O store); local_tile = the
# CTA's n-th tile (persistent); iter = KV iteration (0 = first block processed). An unwritten
# pair stays as the host left it (0).
TRACE_HEADER = 16
SUM_CYCLES, SUM_NS, SUM_SPANS = 6, 7, 8  # header words of the running sums

# The backward's clock probe (sm90/bwd.py, FlashBwdSm90Probe): 4 words per CTA (clock64 and
# globaltimer at its start, then at its end), then PROBE_SUM_WORDS more: every CTA's clock64
# cycles, globaltimer ns and a count of CTAs, summed over every launch since the host last zeroed
# them, and one unused word.
PROBE_SUM_WORDS = 4
TRACE_TILES = 4
TRACE_ITERS = 128
TRACE_OPS = 16
TRACE_ROLES = 5
TRACE_WORDS = TRACE_HEADER + TRACE_ROLES * TRACE_TILES * TRACE_ITERS * TRACE_OPS * 2
# op ids (consumer roles): simulator names QK{w}, PV{w}, ... (fa4sim/schedules/fa3_sm90.py)
T_LK, T_LV, T_LQ = 0, 1, 2  # producer: start = issue (acquire returned), end = TMA issued
T_QK = 3  # start = wgmma issue, end = wait for S done
T_PV = 4  # start = wgmma issue, end = its wait done
T_MAX, T_EXP, T_RESC, T_CVT, T_FIN = 5, 6, 7, 8, 9
T_ST = 10  # epilogue: start = all consumers' O in smem (barrier), end = TMA store done
T_PP = 11  # ping-pong arrive (hand the tensor core to the next WG)
T_WAIT_K, T_WAIT_V, T_WAIT_PP = 12, 13, 14  # consumer waits (not simulator ops); producer:
# T_WAIT_K / T_WAIT_V = waiting for an empty K / V stage (producer_acquire)
T_MASK = 15
TRACE_OP_NAMES = {T_LK: "LK", T_LV: "LV", T_LQ: "LQ", T_QK: "QK", T_PV: "PV", T_MAX: "MAX",
                  T_EXP: "EXP", T_RESC: "RESC", T_CVT: "CVT", T_FIN: "FIN", T_ST: "ST", T_PP: "PP",
                  T_WAIT_K: "WAIT_K", T_WAIT_V: "WAIT_V", T_WAIT_PP: "WAIT_PP", T_MASK: "MASK"}
# the light trace (KernelConfig.trace_light) stamps only these; its EXP = the whole softmax
LIGHT_OPS = (T_QK, T_PV, T_EXP, T_FIN, T_ST)

# CTA log (KernelConfig.cta_log, a clock-probe build): every CTA's thread 0 writes its SM id and
# its start stamps, warp 4 lane 0 its end stamps after its last O store, at
#   TRACE_HEADER + blockIdx.x * CTA_LOG_WORDS: [smid, globaltimer start, globaltimer end,
#   clock64 start, clock64 end, 1 (written)]
# for blockIdx.x < CTA_LOG_MAX (the per-op pair region, which a probe build leaves unused).
CTA_LOG_WORDS = 6
CTA_LOG_MAX = (TRACE_WORDS - TRACE_HEADER) // CTA_LOG_WORDS
# Tile log (a persistent CTA-log build only): consumer warpgroup 0's thread 0 writes clock64 as it
# starts each tile, at TILE_LOG_BASE + flat tile id (m_block + num_m * (batch * heads + head)),
# for tile ids < TILE_LOG_MAX; a persistent grid (one CTA per SM) stays below TILE_LOG_CTAS, so
# its CTA records end before the tile log begins.
TILE_LOG_CTAS = 1024
TILE_LOG_BASE = TRACE_HEADER + TILE_LOG_CTAS * CTA_LOG_WORDS
TILE_LOG_MAX = TRACE_WORDS - TILE_LOG_BASE
