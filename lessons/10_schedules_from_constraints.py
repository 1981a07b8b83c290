# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lesson 10: schedules from constraints (about 30 minutes)
#
# Every lesson so far replays a schedule somebody wrote by hand: each warp role's program, in
# order, with its skews (FA4's MMA warp issues `PV(j-1)` in iteration j). The engine reads that
# schedule as data (`fa4sim/engine.py`): **ops** that occupy **units** for some cycles, **warp
# roles** that issue them, and **edges** "dst waits for src" with a loop **distance**. This
# lesson reads the same data as a constraint problem, as a compiler's software pipeliner does
# (modulo scheduling):
#
# - **II**, the initiation interval: cycles per loop iteration in the steady state (a KV block).
# - **ResMII**, the resource bound: no unit can do more than its cycles per iteration allow.
#   II >= (cycles all ops put on a unit per iteration) / (the unit's capacity), for every unit;
#   and a warp role issues one op at a time, so II >= the sum of its ops' holds.
# - **RecMII**, the recurrence bound: a cycle of edges whose delays add up to L and whose
#   distances add up to D says "iteration i of this op waits, L cycles later, for iteration
#   i - D of itself": II >= L / D. RecMII is the largest such ratio over the graph's cycles.
# - **A solver** (OR-Tools CP-SAT, `fa4sim/modulo.py`) finds the smallest II for which every op
#   gets an offset that respects every edge and every unit, and turns it into role programs
#   (prologue, steady state, epilogue) that the engine replays.
#
# The method, as always: predict on paper, compute, compare, explain. The reference is
# `docs/schedules-from-constraints.md`; the command line has it as `fa4sim graph` and
# `fa4sim solve`. Everything here runs on a CPU in a few seconds.

# %%
import math
import os
import tempfile

import lessonkit as kit
from fa4sim import Problem, graph, hardware, modulo
from fa4sim.engine import Edge, Op, Schedule
from fa4sim.engine import simulate as run_engine
from fa4sim.model import setup
from fa4sim.schedules import fa4_sm100

LIVE = kit.live()  # unused: everything here is solved and simulated
TIME_LIMIT_S = 2.0  # CP-SAT's time per solve at most; most solves here take a tenth of that

# %% [markdown]
# ## 1. A toy pipeline, by hand
#
# Four ops, three warp roles, three units; the numbers are small on purpose:
#
# | op | role | unit, cycles | latency | what |
# |---|---|---|---|---|
# | `LOAD` | load | tma 32 | 288 | the TMA brings K/V block j into a slot of a 2-slot ring (asynchronous) |
# | `S` | mma | tensor 64 | 16 | S = Q K^T into TMEM (asynchronous: the warp issues it and moves on) |
# | `EXP` | softmax | mufu 96 | 0 | P = exp2(S - max) (the warpgroup is busy until it is done) |
# | `PV` | mma | tensor 64 | 16 | O += P V |
#
# An asynchronous op **completes** its unit cycles plus its latency after its issue (`S`: 80
# cycles) and **holds** its role only while it issues (2 cycles). A blocking op holds its role
# until it completes (`EXP`: 96). An edge's **delay** is the completion of its source (plus a
# signalling lag, 0 here). The edges:
#
# | edge | distance | kind | why |
# |---|---|---|---|
# | `LOAD -> S` | 0 | flow | S reads the block |
# | `S -> EXP` | 0 | flow | EXP reads S |
# | `EXP -> PV` | 0 | flow | PV reads P |
# | `PV -> PV` | 1 | flow | O accumulates: PV(j) adds to what PV(j-1) wrote (a loop-carried recurrence) |
# | `PV -> S` | 1 | anti | S and P share one TMEM slot: S(j+1) overwrites P(j) only after PV(j) has read it |
# | `PV -> LOAD` | 2 = slots | anti | block j+2 goes into block j's slot only after PV(j), its last reader, is done |
#
# An anti-dependence (write after read) over a ring of n slots has distance n: that is what
# buffers buy. The MMA warp issues `S(j)` then `PV(j)`; the tensor core runs its ops in issue
# order (an issue queue of 4).

# %%
def toy(kv_slots=2, sp_slots=1):
    """The toy pipeline as an engine Schedule: kv_slots K/V slots, sp_slots S/P slots in TMEM."""
    ops = [Op("LOAD", "load", (("tma", 32.0),), 288.0, kind="load", asynchronous=True, issue_cycles=1.0),
           Op("S", "mma", (("tensor", 64.0),), 16.0, kind="mma", asynchronous=True, issue_cycles=2.0),
           Op("PV", "mma", (("tensor", 64.0),), 16.0, kind="mma", asynchronous=True, issue_cycles=2.0),
           Op("EXP", "softmax", (("mufu", 96.0),))]
    edges = [Edge("LOAD", "S"), Edge("S", "EXP"), Edge("EXP", "PV"),
             Edge("PV", "PV", 1),
             Edge("PV", "S", sp_slots, kind="anti"),
             Edge("PV", "LOAD", kv_slots, kind="anti")]
    return Schedule("toy", {"tma": 1, "tensor": 1, "mufu": 1}, ["load", "mma", "softmax"], ops, edges,
                    marker="S", issue_depth={"tensor": 4})


TOY = toy()
g = graph.build(TOY)  # the dependency graph, read from the Schedule itself
print(f"{'op':5s} {'role':8s} {'units':12s} {'completion':>10s} {'hold':>5s}")
for n in g.nodes:
    print(f"{n.name:5s} {n.role:8s} {', '.join(f'{u} {c:.0f}' for u, c in n.uses.items()):12s} "
          f"{n.completion:10.0f} {n.hold:5.0f}")
for d in g.deps:
    print(f"  {d.src:4s} -> {d.dst:4s} distance {d.distance}  {d.kind:4s}  delay {d.delay:.0f}")

# %% [markdown]
# ### Exercise 10.1: the bounds by hand
# From the tables: which unit sets ResMII and what is it (cycles per iteration)? What is RecMII
# over the edges? (List the cycles: `PV -> PV`, `S -> EXP -> PV -> S`,
# `LOAD -> S -> EXP -> PV -> LOAD`; for each, the delays' sum over the distances' sum.)

# %%
res_unit_guess = None  # <- a unit name
res_mii_guess = None   # <- cycles
rec_mii_guess = None   # <- cycles

# %%
# SOLUTION (try the exercise first).
if res_unit_guess is None:
    res_unit_guess = "tensor"
if res_mii_guess is None:
    res_mii_guess = 64 + 64  # S and PV on one tensor core; mufu 96, tma 32, the softmax role 96
if rec_mii_guess is None:
    rec_mii_guess = max(80 / 1,                         # O: PV -> PV
                        (80 + 96 + 80) / 1,             # the S/P slot: S -> EXP -> PV -> S
                        ((32 + 288) + 80 + 96 + 80) / 2)  # the K/V ring: LOAD -> S -> EXP -> PV -> LOAD

# %%
res, rec = graph.res_mii(g), graph.rec_mii(g)
print(f"ResMII {res.value:.0f}, set by {res.critical}; every unit and role:",
      {u: round(v) for u, v in res.loads.items()})
print(f"RecMII {rec.value:.0f}: {rec.critical} (delays {sum(d.delay for d in rec.cycle):.0f} over "
      f"distances {sum(d.distance for d in rec.cycle)})")
kit.check(res_unit_guess == res.critical and abs(res_mii_guess - res.value) < 0.5,
          f"add up each unit's cycles per iteration: {res.loads}")
kit.check(abs(rec_mii_guess - rec.value) < 0.5, f"the critical cycle is {rec.critical}")

# %% [markdown]
# The tensor core could start a KV block every 128 cycles, but the 2-slot ring cannot: a slot
# comes back only after a load (320 cycles to complete), S, the exp2 and PV have run, 576 cycles
# for two blocks. The ring is the bound. The S/P slot comes second (256), O's accumulation last.
#
# ## 2. The solver: offsets, stages, programs, and a replay
#
# `modulo.solve` searches II upward from max(ResMII, RecMII): at a fixed II the problem is
# linear, and CP-SAT either finds offsets t_o = stage * II + r (0 <= r < II) for every op or
# proves that none exist. Then, at the best II, it picks the fewest stages and the shortest
# lifetimes. A role's program is its ops sorted by r; an op's **skew** (how many iterations it
# runs behind in the role's loop) is its stage minus the role's smallest stage.

# %%
def replay(schedule, programs, n):
    """Cycles per iteration when the engine runs these role programs over one tile of n iterations."""
    return modulo.replayed_interval(modulo.schedule_from(schedule, programs), n)


def show_programs(sol, g):
    for role, p in modulo.program_text(sol.programs, g).items():
        if p["steady"]:
            print(f"  {role:10s} prologue {p['prologue'] or '-'}  steady k: {' '.join(p['steady'])}  "
                  f"epilogue {p['epilogue'] or '-'}")


sol = modulo.solve(g, time_limit_s=TIME_LIMIT_S)
print(f"II {sol.ii:.0f} ({sol.status}), lower bound {sol.lower_bound:.0f}, {sol.stages} stages, "
      f"solved in {sol.wall_s:.2f} s")
for n in g.nodes:
    k = n.name
    r = sol.offset[k] - sol.stage[k] * sol.ii  # the position in the steady-state window
    print(f"  {k:5s} offset {sol.offset[k]:5.0f} = stage {sol.stage[k]} x {sol.ii:.0f} + {r:3.0f}")
show_programs(sol, g)
toy_replayed, toy_hand = replay(TOY, sol.programs, 40), modulo.replayed_interval(TOY, 40)
print(f"replayed in the engine: {toy_replayed:.1f} cycles per iteration (the solver's II {sol.ii:.0f}); "
      f"the schedule as written: {toy_hand:.1f}")

# %% [markdown]
# The loads run a stage ahead: `LOAD(j)` issues at offset 0 and `S(j)` 320 cycles later, in the
# next stage; the other roles wait on the ring anyway. The programs are the ones written above
# (nothing to reorder here), and the engine replays them at the solver's II: where each op uses
# one unit, the engine and the solver agree to the cycle.
#
# ### Exercise 10.2: how many slots?
# How many K/V slots make the ring's anti-dependence stop binding, so that more slots do not
# lower the bound any more? And what then sets RecMII?

# %%
kv_slots_enough = None  # <- a number of slots

# %%
# SOLUTION (try the exercise first).
if kv_slots_enough is None:
    ring = (32 + 288) + 80 + 96 + 80  # the ring's delays; its distance is the number of slots
    kv_slots_enough = next(s for s in range(1, 10) if ring / s <= 80 + 96 + 80)  # the S/P slot's 256 takes over


# %%
def mii(schedule):
    g = graph.build(schedule)
    return max(graph.res_mii(g).value, graph.rec_mii(g).value)


by_slots = {s: mii(toy(kv_slots=s)) for s in range(1, 9)}
print("max(ResMII, RecMII) by K/V slots:", {s: round(v) for s, v in by_slots.items()})
kit.check(by_slots[kv_slots_enough] == by_slots[8] and by_slots[kv_slots_enough - 1] > by_slots[8],
          "find the fewest slots after which the bound stops falling")
g3 = graph.build(toy(kv_slots=kv_slots_enough))
sol3 = modulo.solve(g3, time_limit_s=TIME_LIMIT_S)
print(f"{kv_slots_enough} slots: RecMII {graph.rec_mii(g3).value:.0f} ({graph.rec_mii(g3).critical}); "
      f"solver II {sol3.ii:.0f}, replayed {replay(toy(kv_slots=kv_slots_enough), sol3.programs, 40):.1f}")
show_programs(sol3, g3)

# %% [markdown]
# With 3 slots the S/P slot binds: S(j+1) waits for PV(j), which waits for the exp2 of S(j).
# The solver's MMA program now starts its iteration with `PV(k-1)`: the same order as written,
# rotated.
#
# **A second S/P slot.** Give S and P two TMEM slots (`sp_slots=2`, distance 2) and enough K/V
# slots that the ring does not bind: RecMII over the edges halves. But the MMA warp's program
# order is a recurrence too. It issues `S(j+1)` after `PV(j)`, and the tensor core runs them in
# issue order, so S(j+1) starts only after PV(j)'s tensor work, which waits for EXP(j), which
# waits for S(j): 80 + 96 + 64 cycles per iteration, two slots or not. `graph.rec_mii(g,
# with_order=True)` adds the roles' program order to the edges. The solver's default,
# `order="code"`, keeps the MMA issue order (the kernel relies on it); `order="compute"` lets it
# reorder the MMAs as if their operands had their own buffers.

# %%
TWO = toy(kv_slots=6, sp_slots=2)
g2 = graph.build(TWO)
print(f"ResMII {graph.res_mii(g2).value:.0f}, RecMII {graph.rec_mii(g2).value:.0f} over the edges, "
      f"{graph.rec_mii(g2, with_order=True).value:.0f} with the program order "
      f"({graph.rec_mii(g2, with_order=True).critical})")
for order in ("code", "compute"):
    s2 = modulo.solve(g2, order=order, time_limit_s=TIME_LIMIT_S)
    proven = sorted(ii for ii, v in s2.tried.items() if v == "infeasible")
    print(f"order={order}: II {s2.ii:.0f} ({s2.status}), replayed {replay(TWO, s2.programs, 40):.1f}"
          + (f"; every II from {proven[0]} to {proven[-1]} proven infeasible" if proven else ""))
    show_programs(s2, g2)

# %% [markdown]
# Free to reorder, the solver issues S two iterations ahead of PV (`PV(k-2) S(k)`) and comes
# close to the tensor core's 128 cycles: 144, and CP-SAT proves that no II from 128 to 143
# exists. Bounds are bounds: at II = 128 the tensor core runs S and PV back to back, so PV
# starts 64 cycles after an S (modulo 128). But the chain S -> EXP -> PV puts PV(j) at least
# 176 cycles after S(j), and S(j+2), 256 cycles after S(j), must wait 80 for PV(j): at most
# 176. So PV(j) starts exactly 176 = 128 + 48 cycles after S(j), on top of an S. Only a search
# tells. FA4 faces the same trade below: its MMA order is its recurrence.
#
# ## 3. FA4's forward on B200
#
# The real schedule is built as `simulate()` builds it (`fa4sim/schedules/fa4_sm100.py`): hd128,
# the default problem of `fa4sim solve` (batch 2, 16 heads, 8192 tokens: 64 KV blocks per tile).

# %%
PROBLEM = Problem(batch=2, heads=16, seqlen_q=8192, seqlen_k=8192, hdim=128)
b200 = hardware.load("b200")


def loop(hw, schedule=None, overrides=None, pass_="fwd", problem=PROBLEM):
    """(the hand Schedule of one CTA's longest tile, its iterations, the knobs), as `fa4sim graph` builds it."""
    profile, _, module, impl, knobs = setup(hw, schedule, problem, dict(overrides or {}), None, pass_)
    n = math.ceil(problem.seqlen_q / knobs["tile_m"] if pass_ == "bwd" else problem.seqlen_k / knobs["tile_n"])
    return module.build(profile, problem, knobs, n, 0, impl), n, knobs


def study(hw, schedule=None, overrides=None, pass_="fwd", order="code"):
    """Bounds, the solver's II and programs, and the engine's replay of both programs."""
    sched, n, knobs = loop(hw, schedule, overrides, pass_)
    g = graph.build(sched)
    sol = modulo.solve(g, order=order, time_limit_s=TIME_LIMIT_S)
    return {"schedule": sched, "n": n, "knobs": knobs, "graph": g, "sol": sol,
            "res": graph.res_mii(g), "rec": graph.rec_mii(g), "rec_order": graph.rec_mii(g, with_order=True),
            "replayed": replay(sched, sol.programs, n), "hand": modulo.replayed_interval(sched, n)}


def draw_graph(g, res, rec, title):
    """The loop graph as fa4sim graph --plot draws it, shown inline."""
    from fa4sim.graph_plot import draw

    fd, path = tempfile.mkstemp(suffix=".png", prefix="fa4lesson_")
    os.close(fd)
    draw(g, path, res, rec, title=title)
    try:
        from IPython import get_ipython
        from IPython.display import Image, display
        if get_ipython() is not None:
            display(Image(filename=path))
            os.unlink(path)
            return
    except ImportError:
        pass
    print(f"(graph drawn to {path})")


FA4 = study("b200")
g4 = FA4["graph"]
print(f"{len(g4.loop_nodes)} ops per iteration ({len(g4.nodes) - len(g4.loop_nodes)} more once per tile), "
      f"{len(g4.units)} units, {len(g4.roles)} roles, {len(g4.loop_deps)} edges in the loop, "
      f"{len(g4.order)} program-order edges")
busiest = sorted(FA4["res"].loads.items(), key=lambda kv: -kv[1])[:5]
print("busiest units and roles, cycles per iteration:", {u: round(v) for u, v in busiest})
draw_graph(g4, FA4["res"], FA4["rec_order"],
           f"FA4 forward on B200, hd128: one iteration; ResMII {FA4['res'].value:.0f} ({FA4['res'].critical}), "
           f"RecMII with the program order {FA4['rec_order'].value:.0f}")

# %% [markdown]
# One lane per warp role, each op at its earliest start within an iteration. **Predict before
# the next cell:** the tensor core's 2048 cycles per KV block are the largest unit load. Is the
# hand schedule (lesson 04's ping-pong) at that bound? If not, which cycle of the graph holds it
# back?

# %%
for label, b in (("ResMII", FA4["res"]), ("RecMII, edges only", FA4["rec"]),
                 ("RecMII with the program order", FA4["rec_order"])):
    print(f"{label:30s} {b.value:7.1f}  {b.critical}")
print("the critical cycle, edge by edge:")
for d in FA4["rec_order"].cycle:
    print(f"  {d.src:6s} -> {d.dst:6s} {d.kind:5s} distance {d.distance}  delay {d.delay:6.1f}")
sol4 = FA4["sol"]
print(f"solver: II {sol4.ii:.0f} ({sol4.status}), {sol4.stages} stages, {sol4.wall_s:.2f} s; "
      f"replayed {FA4['replayed']:.1f}; the hand schedule {FA4['hand']:.1f}")
show_programs(sol4, g4)

# %% [markdown]
# The critical cycle is Q tile 1's S/P chain through the MMA warp's order: `QK1` (S = Q K^T)
# completes, the softmax warpgroup takes the row max (`MAX1`) and the first 3/4 of the exp2
# (`EXPa1`, the point where split P signals), then the MMA warp issues `PVa1` and `PVb1` (O +=
# P V, in two parts), and only then, one iteration later, the next `QK1`: S(j+1) goes into the
# TMEM slot P(j) occupies, so it may be issued only after PV(j) (order edges, distance 1). The
# edges alone allow 655 cycles (the K ring); the order makes it 2419, 18 % above the tensor core.
#
# The solver keeps the orders the kernel relies on (`order="code"`), and returns the hand
# program, at the bound. The engine replays it at 2424 cycles, as it replays the hand schedule:
# 0.2 % above the bound.
#
# **What-ifs.** Each `--set` of `fa4sim run` works here: change a hardware number or a knob,
# rebuild, bound, solve, replay. Predict first: with a B300-like MUFU (32 exp2 per clock), does
# the loop become tensor-bound? With fewer K/V slots, when does the ring bind?

# %%
WHAT_IFS = [("as shipped", {}, "code"),
            ("mufu_ex2_per_clk=32", {"mufu_ex2_per_clk": 32}, "code"),
            ("  and exp_emulation=0", {"mufu_ex2_per_clk": 32, "exp_emulation": 0}, "code"),
            ("kv_stages=4", {"kv_stages": 4}, "code"),
            ("kv_stages=3", {"kv_stages": 3}, "code"),
            ("kv_stages=2", {"kv_stages": 2}, "code"),
            ("order=compute", {}, "compute")]
runs = {}
print(f"{'what-if':24s} {'ResMII':>7s} {'RecMII+order':>12s} {'solver II':>14s} {'replayed':>9s} {'hand':>7s}  "
      "critical cycle with the program order")
for label, over, order in WHAT_IFS:
    r = runs[label] = FA4 if (not over and order == "code") else study("b200", overrides=over, order=order)
    print(f"{label:24s} {r['res'].value:7.0f} {r['rec_order'].value:12.0f} {r['sol'].ii:6.0f} {r['sol'].status:7s} "
          f"{r['replayed']:9.0f} {r['hand']:7.0f}  {r['rec_order'].critical}")

# %% [markdown]
# - **A faster MUFU** shortens the exp2 on the chain: 2131, still above 2048. With emulation off
#   all exp2s go to the MUFU and the chain grows again.
# - **K/V slots.** With 4 slots or more the ring does not bind; at 3 it does (`PVa1 -> PVb1 ->
#   LK -> QK0 -> PVa1`: a K load waits until PVb1 has read the V in its slot, and QK0 waits for
#   that K), at 2 much more.
#   Solver, replay and hand agree: the hand schedule is the best program with that order.
# - **`order="compute"`** frees the MMA warp's issue order. The solver reaches the tensor core's
#   2048 cycles, and the engine replays the new program at 2048. Read its MMA program:

# %%
comp = runs["order=compute"]
mma = modulo.program_text(comp["sol"].programs, comp["graph"])["mma"]
print("order=compute, the MMA warp: steady k:", " ".join(mma["steady"]))
hand_mma = modulo.program_text({"mma": [(o.name, o.skew) for o in FA4["schedule"].ops if o.role == "mma"]}, g4)["mma"]
print("the hand program, the MMA warp: steady k:", " ".join(hand_mma["steady"]))

# %% [markdown]
# In the solver's program the MMA warp issues tile 0's `QK0(k)` before `PVa0(k-1)` and
# `PVb0(k-1)`, and tile 1's `QK1(k-1)` before `PVa1(k-2)` and `PVb1(k-2)`: each tile's S is
# computed while its previous P still waits to be read, so S needs a TMEM slot of its own: a
# second S/P slot per Q tile. The model checks order only as far as `order` says;
# capacity is for us to check.
#
# ### Exercise 10.3: does it fit?
# On B200 an S/P slot takes `tile_n` = 128 TMEM columns (fp32 S; P overlays half of it) and O
# takes `hdim_v` = 128. With two Q tiles and two S/P slots per tile, how many TMEM columns does
# the compute-order program need? A B200 SM has 512.

# %%
tmem_needed = None  # <- columns

# %%
# SOLUTION (try the exercise first).
if tmem_needed is None:
    tmem_needed = 2 * (2 * 128 + 128)  # Q tiles x (S/P slots x tile_n + hdim_v)

# %%
need = fa4_sm100.tmem_columns(PROBLEM, {**FA4["knobs"], "s_stages": 2})
print(f"shipped: {fa4_sm100.tmem_columns(PROBLEM, FA4['knobs'])} columns; two S/P slots per tile: {need}; "
      f"the SM has {b200.tmem_columns}")
kit.check(tmem_needed == need, f"q_tiles {FA4['knobs']['q_tiles']} x (2 x tile_n {FA4['knobs']['tile_n']} "
                               f"+ hdim_v {PROBLEM.hdim_v})")

# %% [markdown]
# 768 columns do not fit in 512: the constraint that keeps FA4's forward 18 % above the tensor
# core's bound is TMEM's capacity, expressed as the MMA warp's order. (The `fa4` schedule runs
# two S/P slots, `s_stages=2`, only with one Q tile.)
#
# **And with no TMEM at all?** Then S, P and O live in registers, as on Hopper: a warpgroup holds
# 64 query rows, so its MMAs have M = 64, which Blackwell's tensor core runs at half rate. The
# Hopper schedule on the B200 profile is that what-if (`fa4sim solve --hw b200 --schedule fa3`).
# Its iteration is one tile of 128 rows, FA4's two, so compare cycles per 128 query rows.

# %%
NO_TMEM = study("b200", "fa3")
fa4_per_tile = FA4["sol"].ii / FA4["knobs"]["q_tiles"]
print(f"no TMEM: ResMII {NO_TMEM['res'].value:.0f} ({NO_TMEM['res'].critical}), solver II "
      f"{NO_TMEM['sol'].ii:.0f}, replayed {NO_TMEM['replayed']:.0f}, hand {NO_TMEM['hand']:.0f} cycles per 128 rows")
print(f"FA4 with TMEM: {fa4_per_tile:.0f} cycles per 128 rows; without: {NO_TMEM['sol'].ii / fa4_per_tile:.2f}x")
kit.check(NO_TMEM["res"].critical == "tensor" and NO_TMEM["sol"].ii > fa4_per_tile,
          "without TMEM the half-rate M = 64 MMAs bind the loop")

# %% [markdown]
# Without TMEM the tensor core itself is the bound, at half its rate: about 1.7x FA4's cycles
# for the same work. TMEM is what lets one warp issue M = 128 MMAs whose accumulators no
# warpgroup's registers could hold.
#
# ## 4. Where the solver and the engine part
#
# The solver's model is simpler than the engine in two ways (`docs/schedules-from-constraints.md`,
# "Where the model is approximate"): it serves units at their **nominal** rate, and it reserves a
# blocking op's work on a unit as **one block**, where the engine spreads it in pieces that
# interleave with other warps' pieces. Two schedules show each.
#
# **FA3-style forward on H100.** Beside a running wgmma, Hopper's warps issue and the MUFU runs
# slower (measured; `fa4sim params --hw h100`). The engine charges that slowdown to each piece
# that starts while the tensor core is busy; the schedule lists it as `interference`.

# %%
FA3 = study("h100", "fa3")
print("interference (unit: slowed while this unit is busy, to this share of its rate):",
      {u: (cause, round(f, 2)) for u, (cause, f) in FA3["schedule"].interference.items()})
slowed = graph.res_mii(graph.build(FA3["schedule"], slowed=True))
print(f"ResMII at nominal rates {FA3['res'].value:.0f} ({FA3['res'].critical}); "
      f"with every piece slowed {slowed.value:.0f} ({slowed.critical})")
s = FA3["sol"]
print(f"solver: II {s.ii:.0f} ({s.status}); replayed {FA3['replayed']:.0f} "
      f"({FA3['replayed'] / s.ii - 1:+.0%}); the hand schedule {FA3['hand']:.0f} ({FA3['hand'] / s.ii - 1:+.0%})")
show_programs(s, FA3["graph"])

# %% [markdown]
# The solver finds a program at the tensor core's nominal 2048 cycles, and both it and the hand
# program run about a fifth slower in the engine: the softmax's instructions issue at a third to
# a half of their rate beside the wgmma. The bound with every piece slowed is not a bound either
# (the engine slows only pieces that start while the tensor core is busy); the truth lies between
# the two, and only the simulation says where. Without the slowdown, the solver finds no better
# order either: P's conversion issues among the exp2s (as compiled), so the O rescale is a
# warpgroup's last op before its next S GEMM, and the solver, keeping that order, returns the hand
# program.
#
# **FA4's backward on B200** (a CTA pair; five MMAs per Q block, lesson 09). The solver charges
# no slowdown here, but the compute, reduce and MMA warps share shared memory and TMEM.

# %%
BWD = study("b200", pass_="bwd")
s = BWD["sol"]
print(f"ResMII {BWD['res'].value:.0f} ({BWD['res'].critical}); RecMII with the program order "
      f"{BWD['rec_order'].value:.0f} ({BWD['rec_order'].critical})")
print(f"solver: II {s.ii:.0f} ({s.status}); replayed {BWD['replayed']:.0f} ({BWD['replayed'] / s.ii - 1:+.0%}); "
      f"the hand schedule {BWD['hand']:.0f} ({BWD['hand'] / s.ii - 1:+.0%})")

# %% [markdown]
# The recurrence is the single dO stage: dO(j+1) loads only after dV(j) has read dO(j), with dP
# and dQ between them in the MMA warp's order. The solver sits on it; the engine replays both
# programs 8 to 10 % above it, because the warps' pieces on shared memory and TMEM interleave
# and stretch one another, which one block per op does not. (The solver's program depends on
# which of several optimal solutions CP-SAT returns in its time, so its replay varies by a
# percent or two from run to run; the hand schedule's does not.)
#
# ## 5. Exercises
#
# ### Exercise 10.4: a tensor core twice as fast
# Double B200's tensor core (`tensor_flops_per_clk`). Which unit then sets ResMII? Is the FA4
# forward then bound by ResMII or by its recurrence with the program order?

# %%
TWICE = {"tensor_flops_per_clk": 2 * b200.tensor_flops_per_clk}
unit_after = None   # <- a unit name
bound_after = None  # <- "ResMII" or "RecMII"

# %%
# SOLUTION (try the exercise first).
if unit_after is None:
    unit_after = "mufu"  # tensor 2048 -> 1024; next is the MUFU's 1664 (both tiles' exp2, less the emulated share)
if bound_after is None:
    bound_after = "RecMII"  # the S/P chain still has the exp2 and the row max on it

# %%
fast = study("b200", overrides=TWICE)
print(f"ResMII {fast['res'].value:.0f} ({fast['res'].critical}); RecMII with the program order "
      f"{fast['rec_order'].value:.0f} ({fast['rec_order'].critical})")
kit.check(unit_after == fast["res"].critical, f"the busiest unit or role: {fast['res'].loads}")
kit.check(bound_after == ("RecMII" if fast["rec_order"].value > fast["res"].value else "ResMII"),
          "compare the two bounds")
print(f"solver: II {fast['sol'].ii:.0f} ({fast['sol'].status}); replayed {fast['replayed']:.0f}; "
      f"the hand schedule {fast['hand']:.0f}")

# %% [markdown]
# The bounds say about 2120 cycles, the solver agrees, and the engine says about 2660 for both
# programs: a quarter more. **Explain**, from the trace: how long does each softmax op take in
# the engine, against its time alone on idle units (`completion`)?

# %%
trace = run_engine(fast["schedule"], [fast["n"]])
steady = [r for r in trace.ops if fast["n"] // 4 <= r.iter < fast["n"] // 2]  # a stretch of the steady state
for n in fast["graph"].loop_nodes:
    if n.role.startswith("softmax"):
        took = [r.end - r.start for r in steady if r.name == n.name]
        print(f"{n.name:6s} alone {n.completion:5.0f} cycles, in the engine {sum(took) / len(took):5.0f}")

# %% [markdown]
# With the tensor core twice as fast the two softmax warpgroups' work overlaps, and their exp2s
# share the MUFU (busy 1664 of about 2120 cycles: little room to take turns). The engine
# interleaves the two warpgroups' pieces on the MUFU, so the ops that run beside the other
# warpgroup's exp2 stretch (`EXPb0` about three times, `MAX1` by a fifth, `EXPa1` by two
# fifths), and `MAX1` and `EXPa1` are on the critical chain. The solver gives each op one block
# of the MUFU and packs the blocks side by side, which two warps' instruction streams do not do.
# On a chip with that tensor core the MUFU, not the tensor core, is the unit to speed up next
# (or more of the exp2 to emulate on the FMA pipe: lesson 05).
#
# ## What to remember
#
# - A schedule is a graph: ops with unit cycles, roles, and edges with distances. ResMII is the
#   busiest unit; RecMII is the slowest cycle, delays over distances; an anti-dependence over n
#   buffer slots has distance n, and more slots help only until another cycle binds.
# - A warp's program order is a recurrence too: FA4's forward sits 18 % above the tensor core
#   because S(j+1) may enter the TMEM slot of P(j) only after PV(j). Freeing that order reaches
#   the tensor core's bound, with 768 TMEM columns that a B200 SM does not have.
# - CP-SAT finds the smallest II and proves it; bounds alone can be below any feasible II.
# - The engine is the judge: where units slow each other (Hopper's wgmma) or warps share a unit
#   piece by piece, the replay lands above the solver's II, and the simulation says by how much.
