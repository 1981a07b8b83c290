"""fa4sim: a discrete-event, cycle-level model of one SM running FlashAttention schedules.

Layout (one idea per module):
  engine.py           SimPy engine: units, warp roles, ops, dependencies (knows nothing of attention)
  hardware.py         hardware profiles as data (profiles/*.json), every value with its source
  implementation.py   implementations as data (implementations/*.json): what fa4kernel and
                      flash-attn-4 choose (tiles, launch, measured constants), with sources
  tensor_core.py      MMA cycles from shape and rate (wgmma, tcgen05.mma)
  exp2_emulation.py   FA4's polynomial exp2 on the FMA pipe: numerics and cost
  softmax.py          softmax instruction counts per score element -> unit cycles
  rescale.py          conditional rescaling: how often a warp rescales O
  schedules/          fa4_sm100 (FA4 forward, Blackwell), fa3_sm90 (FA3-style forward, Hopper), their
                      backward passes: ops, units and dependencies of one CTA, and the what-if knobs
  steady_state.py     periodic steady state detection and exact extrapolation
  tile_order.py       the order a kernel hands out its Q tiles, and fa4kernel's host table
  kernel_model.py     tiles over SMs: persistent / longest-first scheduling, waves, tile jitter, L2/HBM
  model.py            simulate(): everything together -> Result (a backward: BwdResult)
  power.py            power -> clock: unit activity, board power, the clock under the cap
  graph.py            one loop iteration as a dependency graph, and its II bounds (ResMII, RecMII)
  modulo.py           a modulo schedule by CP-SAT: offsets, stages, role programs, replayed
  validate/           predicted vs measured, one module per kind of recorded GPU evidence
  gantt.py, perfetto.py, graph_plot.py, cli.py, sweep.py: outputs and the command line
"""
from . import implementation
from .errors import DeadlockError, InputError
from .model import BwdResult, Result, simulate
from .params import Problem

__all__ = ["simulate", "Problem", "Result", "BwdResult", "InputError", "DeadlockError"]
