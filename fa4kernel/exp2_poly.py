"""The exp2 emulation's polynomial: one copy of its coefficients, read by the kernels
(softmax.py) and by the simulator's numerics (fa4sim/exp2_emulation.py). Plain Python, no imports.

p(f) = ((c3*f + c2)*f + c1)*f + c0 approximates 2^f for the fraction f of the range reduction.
"""

COEFFS = (1.0, 0.6951461434, 0.2275643945, 0.0771190897)  # c0..c3, degree-3 minimax
INTERVAL = (0.0, 1.0)  # the fit's interval of f: [0, 1)
MAX_REL_ERROR = 8.8e-5  # max |p(f) / 2^f - 1| on INTERVAL (float64: 8.763e-5 at f = 0.1008)
SOURCE = "flash-attn-4, flash_attn/cute/utils.py (ex2_emulation); docs/reference/fa4-schedules.md"
