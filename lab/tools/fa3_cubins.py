"""FlashAttention-3's library read on the CPU: its kernels' names parsed into their mainloop
configuration (tile, head dim, flags), and the cubins that hold them taken out of the .so.

    from lab.tools.fa3_cubins import fa3_kernels, fa3_pick
    kernels = fa3_kernels("flash_attn_3/_C.abi3.so")      # [(cubin bytes, kernel name, config)]
    cub, name, cfg = fa3_pick(kernels, 128, causal=False)[0]

The .so's .nv_fatbin section holds the cubins uncompressed, back to back. A kernel's template
arguments are read from its mangled name (a small Itanium demangler for the subset CUTLASS uses:
nested names, template arguments, packs, int / bool literals, substitutions), so the forward
mainloop's `CollectiveMainloopFwdSm90<Stages, ClusterShape, TileShape_MNK, kHeadDimV, Element,
ElementAccum, Arch, Is_causal, Is_local, Has_softcap, Varlen, PagedKVNonTMA, AppendKV, HasQv,
MmaPV_is_RS, IntraWGOverlap, PackGQA, Split, V_colmajor, ...>` gives each kernel's configuration.
Plain Python, no GPU and no CUDA tools (lab/tools/loop_sass_peers.py disassembles what it picks).
"""
from __future__ import annotations

import re
import struct

FA3_FLAGS = ("causal", "local", "softcap", "varlen", "paged_kv_non_tma", "append_kv", "has_qv",
             "mma_pv_is_rs", "intra_wg_overlap", "pack_gqa", "split", "v_colmajor")


class _Mangled:
    """A recursive-descent reader of the Itanium mangling subset CUTLASS kernel names use."""
    BUILTIN = {"f": "float", "d": "double", "i": "int", "j": "unsigned", "b": "bool", "v": "void"}

    def __init__(self, text):
        self.t, self.i, self.subs, self.found = text, 0, [], {}

    def take(self, pattern):
        m = re.compile(pattern).match(self.t, self.i)
        if not m:
            raise ValueError(f"unparsed mangling at {self.i}: {self.t[self.i:self.i + 20]!r}")
        self.i = m.end()
        return m.group()

    def args(self):  # I<arg>*E, J<arg>*E
        self.i += 1
        out = []
        while self.t[self.i] != "E":
            if self.t[self.i] == "L":  # a literal: Li128E, Lb1E
                kind, val = self.take(r"L[a-z]")[1], self.take(r"n?\d+").replace("n", "-")
                self.take("E")
                out.append(bool(int(val)) if kind == "b" else int(val))
            else:
                out.append(self.args() if self.t[self.i] == "J" else self.type())
        self.i += 1
        return out

    def template(self, prefix):
        node = (prefix if isinstance(prefix, str) else prefix[0], self.args())
        self.found.setdefault(node[0], node[1])
        self.subs.append(node)
        return node

    def part(self, prefix):  # one component: a substitution, template args, a template param, a name
        c = self.t[self.i]
        if c == "S":
            seq = self.take(r"S[0-9A-Z]*_")[1:-1]
            return self.subs[int(seq, 36) + 1 if seq else 0]
        if c == "I":
            return self.template(prefix)
        if c == "T":
            self.take(r"T[0-9A-Z]*_")
        else:
            n = int(self.take(r"\d+"))
            self.i += n
            base = prefix if isinstance(prefix, str) or prefix is None else prefix[0]
            name = self.t[self.i - n:self.i]
            prefix = f"{base}::{name}" if base else name
        self.subs.append(prefix if c != "T" else "T")
        return prefix if c != "T" else "T"

    def type(self):
        c = self.t[self.i]
        if c in self.BUILTIN:
            self.i += 1
            return self.BUILTIN[c]
        if c != "N":
            node = self.part(None)
            return self.template(node) if self.t[self.i:self.i + 1] == "I" else node
        self.i += 1
        prefix = None
        while self.t[self.i] != "E":
            prefix = self.part(prefix)
        self.i += 1
        return prefix


def demangle_args(name: str) -> dict:
    """{qualified template name: [its arguments]} of a mangled kernel name (first use of each
    template). An argument is an int, a bool, a type name (str), (template name, [args]) or a pack."""
    if not name.startswith("_Z"):
        raise ValueError("not a mangled name")
    m = _Mangled(name)
    m.i = 2
    m.type()
    return m.found


def _ints(node) -> tuple:  # cute::tuple<cute::C<a>, ...> -> (a, ...)
    return tuple(c[1][0] for c in node[1][0])


def fa3_config(name: str):
    """The forward mainloop's configuration of an FA3 kernel name, or None for other kernels."""
    try:
        found = demangle_args(name)
    except (ValueError, IndexError, KeyError):
        return None
    a = found.get("flash::CollectiveMainloopFwdSm90")
    if a is None:
        return None
    sched = next((k.split("::")[-1] for k in found if k.endswith("TileScheduler")), "?")
    flags = dict(zip(FA3_FLAGS, a[7:19]))
    m, n, k = _ints(a[2])
    return {"stages": a[0], "cluster": _ints(a[1]), "tile_m": m, "tile_n": n, "head_dim": k,
            "head_dim_v": a[3], "element": a[4], "scheduler": sched, **flags}


def elf_size(blob: bytes, off: int = 0) -> int:
    """Bytes of the ELF64 image at blob[off:]: the end of its header tables and non-NOBITS sections."""
    phoff, shoff = struct.unpack_from("<QQ", blob, off + 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", blob, off + 0x36)
    end = max(shoff + shentsize * shnum, phoff + phentsize * phnum)
    for i in range(shnum):
        h = off + shoff + i * shentsize
        if struct.unpack_from("<I", blob, h + 4)[0] != 8:  # SHT_NOBITS holds no bytes
            end = max(end, sum(struct.unpack_from("<QQ", blob, h + 0x18)))
    return end


def elf_sections(blob: bytes) -> dict:
    """{section name: (offset, size)} of an ELF64 image."""
    shoff, = struct.unpack_from("<Q", blob, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", blob, 0x3a)
    heads = [struct.unpack_from("<IIQQQQ", blob, shoff + i * shentsize) for i in range(shnum)]
    strs = heads[shstrndx][4]
    return {blob[strs + h[0]:blob.index(b"\0", strs + h[0])].decode(): (h[4], h[5]) for h in heads}


def cubins(blob: bytes) -> list:
    """The CUDA ELF images (e_machine 190) stored uncompressed back to back in a fatbin blob."""
    out, off = [], 0
    while (off := blob.find(b"\x7fELF\x02", off)) >= 0:
        if struct.unpack_from("<H", blob, off + 0x12)[0] != 190:
            off += 4
            continue
        size = elf_size(blob, off)
        out.append(blob[off:off + size])
        off += size
    return out


def fa3_kernels(so_path: str) -> list:
    """[(cubin, kernel name, config)] of every SM90 forward kernel in FA3's library."""
    with open(so_path, "rb") as fh:
        so = fh.read()
    off, size = elf_sections(so)[".nv_fatbin"]
    out = []
    for cub in cubins(so[off:off + size]):
        for sec in elf_sections(cub):
            if sec.startswith(".text.") and (cfg := fa3_config(sec[6:])):
                out.append((cub, sec[6:], cfg))
    return out


def fa3_pick(kernels: list, hd: int, causal: bool) -> list:
    """The plain bf16 kernels for (hd, causal), the one a long launch runs first."""
    plain = [k for k in kernels if k[2]["head_dim"] == hd == k[2]["head_dim_v"] and "bfloat16" in k[2]["element"]
             and k[2]["causal"] == causal and not any(k[2][f] for f in FA3_FLAGS[1:7] + FA3_FLAGS[9:])]
    return sorted(plain, key=lambda k: -k[2]["cluster"][0])


def function_sass(sass: str, name: str) -> str:
    parts = re.split(r"^\s*\.section\s+\.text\.(\S+?),.*$", sass, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))[name]
