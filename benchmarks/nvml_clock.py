"""SM clock during a timed window, sampled through NVML (libnvidia-ml, via ctypes: no extra
package on the device machine).

Why: a Hopper card's SM clock under load is set by its power cap (1.4-1.98 GHz on the H100 of
this workplace, benchmarks/calibrate/README.md), so a time in ms says little about cycles unless
the clock of that very run is recorded next to it.

    s = ClockSampler()          # starts a 0.5 ms polling thread (None-safe: s.ok is False
    with s.window("ours"):      # when NVML is missing, and windows then report nothing)
        ...timed GPU work...
    s.summary()                 # {"ours": {"mhz_mean": ..., "mhz_min": ..., "n": ...}}
"""
from __future__ import annotations

import bisect
import contextlib
import ctypes
import statistics
import threading
import time

NVML_CLOCK_SM = 1


class ClockSampler:
    def __init__(self, device_index: int = 0, period_s: float = 0.0005):
        self.ok = False
        self.error = None
        self._t: list[float] = []  # sample times (perf_counter, ascending) and MHz
        self._mhz: list[int] = []
        self._windows: dict[str, list[tuple[float, float]]] = {}
        try:
            self._nvml = ctypes.CDLL("libnvidia-ml.so.1")
            if self._nvml.nvmlInit_v2() != 0:
                raise RuntimeError("nvmlInit_v2 failed")
            self._h = ctypes.c_void_p()
            if self._nvml.nvmlDeviceGetHandleByIndex_v2(device_index, ctypes.byref(self._h)) != 0:
                raise RuntimeError("nvmlDeviceGetHandleByIndex_v2 failed")
            self.ok = self._read() is not None
        except Exception as e:  # no NVML: timings still work, clocks are reported missing
            self.error = repr(e)
            return
        self._period = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _read(self):
        mhz = ctypes.c_uint()
        if self._nvml.nvmlDeviceGetClockInfo(self._h, NVML_CLOCK_SM, ctypes.byref(mhz)) != 0:
            return None
        return int(mhz.value)

    def _poll(self):
        while not self._stop.is_set():
            v = self._read()
            if v is not None:
                self._mhz.append(v)  # value first: a reader bisecting _t never sees a gap
                self._t.append(time.perf_counter())
            time.sleep(self._period)

    @contextlib.contextmanager
    def window(self, name: str):
        """Mark [enter, exit) as belonging to `name`; the caller synchronizes the GPU inside."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._windows.setdefault(name, []).append((t0, time.perf_counter()))

    def mhz(self, name: str) -> list[int]:
        out = []
        n = len(self._t)
        for t0, t1 in self._windows.get(name, []):
            out += self._mhz[bisect.bisect_left(self._t, t0, 0, n):bisect.bisect_left(self._t, t1, 0, n)]
        return out

    def summary(self, names=None) -> dict:
        res = {}
        for name in (self._windows if names is None else names):
            v = self.mhz(name)
            if v:
                res[name] = {"mhz_mean": statistics.fmean(v), "mhz_min": min(v), "mhz_max": max(v),
                             "n": len(v)}
        return res

    def close(self):
        if self.ok:
            self._stop.set()
            self._thread.join(timeout=1)
