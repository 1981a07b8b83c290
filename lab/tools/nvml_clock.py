"""SM clock during a timed window, sampled through NVML (libnvidia-ml, via ctypes: no extra
package on the device machine).

Why: a Hopper card's SM clock under load is set by its power cap (1.4-1.98 GHz on the H100 of
this workplace, lab/tools/calibrate/README.md), so a time in ms says little about cycles unless
the clock of that very run is recorded next to it.

    s = ClockSampler()          # starts a 0.5 ms polling thread (None-safe: s.ok is False
    with s.window("ours"):      # when NVML is missing, and windows then report nothing)
        ...timed GPU work...
    s.summary()                 # {"ours": {"mhz_mean": ..., "mhz_min": ..., "n": ...}}

Beside the clock it reads the board power: sampled (nvmlDeviceGetPowerUsage, which Hopper's
driver averages over about a second) and from the energy counter
(nvmlDeviceGetTotalEnergyConsumption, mJ since the driver loaded) at each window's ends, the
mean power of exactly that time; and at each window's end the temperature and why the clock is
held below its maximum (the clocks-event reasons, e.g. "sw_power_cap"). summary() adds
power_w_mean (samples), power_w_energy (counter), temperature_c and clock_event_reasons.
"""
from __future__ import annotations

import bisect
import contextlib
import ctypes
import statistics
import threading
import time

NVML_CLOCK_SM = 1
NVML_TEMPERATURE_GPU = 0
# nvmlClocksEventReasons bits (nvml.h): why the clocks are below the application clock
CLOCK_EVENT_REASONS = {0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap",
                       0x8: "hw_slowdown", 0x10: "sync_boost", 0x20: "sw_thermal_slowdown",
                       0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
                       0x100: "display_clock_setting"}


def reason_names(mask: int) -> list[str]:
    """The names of the clocks-event reason bits set in mask (unknown bits as hex)."""
    names = [n for bit, n in CLOCK_EVENT_REASONS.items() if mask & bit]
    rest = mask & ~sum(CLOCK_EVENT_REASONS)
    return names + ([hex(rest)] if rest else [])


class NvmlDevice:
    """One GPU's NVML queries (clock, power, energy, temperature, clock-event reasons, limits);
    each returns None where the driver lacks the query or it fails."""

    def __init__(self, device_index: int = 0):
        self._open(device_index)

    def _open(self, device_index: int) -> None:
        self._nvml = ctypes.CDLL("libnvidia-ml.so.1")
        if self._nvml.nvmlInit_v2() != 0:
            raise RuntimeError("nvmlInit_v2 failed")
        self._h = ctypes.c_void_p()
        if self._nvml.nvmlDeviceGetHandleByIndex_v2(device_index, ctypes.byref(self._h)) != 0:
            raise RuntimeError("nvmlDeviceGetHandleByIndex_v2 failed")

    def _uint(self, fn: str, *args, kind=ctypes.c_uint):
        """One NVML query of an unsigned value, None where the driver lacks it or fails."""
        f = getattr(self._nvml, fn, None)
        if f is None:
            return None
        v = kind()
        try:
            return int(v.value) if f(self._h, *args, ctypes.byref(v)) == 0 else None
        except Exception:  # noqa: BLE001  (an entry point with another signature on an old driver)
            return None

    def power_w(self):
        """The board power now (W; Hopper's driver reports a one-second average), or None."""
        mw = self._uint("nvmlDeviceGetPowerUsage")
        return None if mw is None else mw / 1000.0

    def energy_mj(self):
        """The energy counter (mJ since the driver loaded), or None."""
        return self._uint("nvmlDeviceGetTotalEnergyConsumption", kind=ctypes.c_ulonglong)

    def temperature_c(self):
        return self._uint("nvmlDeviceGetTemperature", NVML_TEMPERATURE_GPU)

    def event_reasons(self):
        """The clocks-event reasons bitmask now (CLOCK_EVENT_REASONS), or None."""
        for fn in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
            v = self._uint(fn, kind=ctypes.c_ulonglong)
            if v is not None:
                return v
        return None

    def sm_mhz(self):
        """The SM clock now (MHz), or None."""
        return self._uint("nvmlDeviceGetClockInfo", NVML_CLOCK_SM)

    def max_sm_mhz(self):
        return self._uint("nvmlDeviceGetMaxClockInfo", NVML_CLOCK_SM)

    def power_limit_w(self):
        """The enforced board power limit (W), or None."""
        mw = self._uint("nvmlDeviceGetEnforcedPowerLimit")
        return None if mw is None else mw / 1000.0


class ClockSampler(NvmlDevice):
    def __init__(self, device_index: int = 0, period_s: float = 0.0005, power_every: int = 4):
        self.ok = False
        self.error = None
        self._t: list[float] = []  # sample times (perf_counter, ascending) and MHz
        self._mhz: list[int] = []
        self._pt: list[float] = []  # power sample times and W (every power_every-th poll)
        self._pw: list[float] = []
        self._power_every = max(1, int(power_every))
        self._windows: dict[str, list[tuple[float, float]]] = {}
        self._ends: dict[str, list[dict]] = {}  # per window: energy (mJ) at its ends, temperature, reasons
        try:
            self._open(device_index)
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
        i = 0
        while not self._stop.is_set():
            v = self._read()
            if v is not None:
                self._mhz.append(v)  # value first: a reader bisecting _t never sees a gap
                self._t.append(time.perf_counter())
            if i % self._power_every == 0:
                w = self.power_w()
                if w is not None:
                    self._pw.append(w)
                    self._pt.append(time.perf_counter())
            i += 1
            time.sleep(self._period)

    @contextlib.contextmanager
    def window(self, name: str):
        """Mark [enter, exit) as belonging to `name`; the caller synchronizes the GPU inside."""
        e0 = self.energy_mj() if self.ok else None
        t0 = time.perf_counter()
        try:
            yield
        finally:
            t1 = time.perf_counter()
            self._windows.setdefault(name, []).append((t0, t1))
            if self.ok:
                self._ends.setdefault(name, []).append(
                    {"t0": t0, "t1": t1, "e0": e0, "e1": self.energy_mj(), "temperature_c": self.temperature_c(),
                     "reasons": self.event_reasons()})

    def mhz(self, name: str) -> list[int]:
        out = []
        n = len(self._t)
        for t0, t1 in self._windows.get(name, []):
            out += self._mhz[bisect.bisect_left(self._t, t0, 0, n):bisect.bisect_left(self._t, t1, 0, n)]
        return out

    def power(self, name: str) -> list[float]:
        """The power samples (W) taken inside `name`'s windows."""
        pt, pw = getattr(self, "_pt", []), getattr(self, "_pw", [])
        n = len(pt)
        out = []
        for t0, t1 in self._windows.get(name, []):
            out += pw[bisect.bisect_left(pt, t0, 0, n):bisect.bisect_left(pt, t1, 0, n)]
        return out

    def energy_power_w(self, name: str):
        """Mean power over `name`'s windows from the energy counter: the energy they took over
        their total time (W), or None without the counter."""
        ends = [e for e in getattr(self, "_ends", {}).get(name, []) if e["e0"] is not None and e["e1"] is not None]
        secs = sum(e["t1"] - e["t0"] for e in ends)
        return sum(e["e1"] - e["e0"] for e in ends) / 1e3 / secs if ends and secs > 0 else None

    def summary(self, names=None) -> dict:
        res = {}
        for name in (self._windows if names is None else names):
            v = self.mhz(name)
            if v:
                res[name] = {"mhz_mean": statistics.fmean(v), "mhz_min": min(v), "mhz_max": max(v),
                             "n": len(v)}
            p = self.power(name)
            if p:
                res.setdefault(name, {}).update(power_w_mean=statistics.fmean(p), power_w_max=max(p), power_n=len(p))
            ends = getattr(self, "_ends", {}).get(name, [])
            ew = self.energy_power_w(name)
            if ew is not None:
                res.setdefault(name, {})["power_w_energy"] = ew
            temps = [e["temperature_c"] for e in ends if e["temperature_c"] is not None]
            if temps:
                res.setdefault(name, {})["temperature_c"] = max(temps)
            masks = [e["reasons"] for e in ends if e["reasons"] is not None]
            if masks:
                union = 0
                for m in masks:
                    union |= m
                res.setdefault(name, {})["clock_event_reasons"] = reason_names(union)
        return res

    def close(self):
        if self.ok:
            self._stop.set()
            self._thread.join(timeout=1)
