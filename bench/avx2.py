"""A copy of the installed jaxlib whose matrix products run their AVX2 code on an AVX-512 host,
to estimate on a Zen 4 what an AVX2-only machine (Zen 3) measures.

`XLA_FLAGS=--xla_cpu_max_isa=AVX2` caps the code XLA generates, but not the kernels of YNNPACK,
the library XLA:CPU calls for matrix products: YNNPACK asks the CPU itself, once, in
`ynn::get_supported_arch_flags()`. The copy's function returns the AVX2 set instead (SSE2 to
AVX2 + FMA3, bits 0-6 of YNNPACK's `arch_flag`s), so every YNNPACK kernel it picks is one an
AVX2-only CPU runs. PyTorch needs no copy: on AMD CPUs MKL runs its AVX2 `zen` sgemm kernel on
both kinds (`perf report` names it), and `ATEN_CPU_CAPABILITY=avx2` caps its other kernels.

    .venv/bin/python -m bench.avx2 DIR     # writes DIR/jaxlib (about 350 MB)
    PYTHONPATH=DIR XLA_FLAGS=--xla_cpu_max_isa=AVX2 ATEN_CPU_CAPABILITY=avx2 \\
        .venv/bin/python -m bench.forward --family dinov2

It is an estimate: the cores stay Zen 4's (clock, caches), and `perf report` should name only
`_fma3` / `_avx2` YNNPACK kernels. Nothing else in the project uses it.
"""

from __future__ import annotations

import argparse
import importlib.util
import mmap
import shutil
import struct
from pathlib import Path

LIBRARY = "libjax_common.so"  # holds XLA:CPU and its YNNPACK
SYMBOL = b"_ZN3ynn24get_supported_arch_flagsEv"  # ynn::get_supported_arch_flags()
PROLOGUE = bytes.fromhex("554889e5")  # push rbp; mov rbp, rsp
AVX2_FLAGS = 0x7F  # sse2 | ssse3 | sse41 | avx | f16c | avx2 | fma3
RETURN_AVX2 = b"\xb8" + struct.pack("<I", AVX2_FLAGS) + b"\xc3"  # mov eax, flags; ret


def installed_jaxlib() -> Path:
    spec = importlib.util.find_spec("jaxlib")
    assert spec is not None and spec.origin is not None, "jaxlib is not installed"
    return Path(spec.origin).parent


def symbol_offset(elf: bytes | mmap.mmap, name: bytes) -> int:
    """The file offset of function `name` in a 64-bit little-endian ELF's symbol table."""
    if elf[:6] != b"\x7fELF\x02\x01":
        raise ValueError("not a 64-bit little-endian ELF file")
    (shoff,) = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", elf, 0x3A)
    # Section header: name, type, flags, addr, offset, size, link, info, align, entsize.
    sections = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    symtab = next((s for s in sections if s[1] == 2), None)  # SHT_SYMTAB
    if symtab is None:
        raise ValueError("the library has no symbol table (stripped)")
    strtab = sections[symtab[6]]
    strings = elf[strtab[4] : strtab[4] + strtab[5]]
    at = strings.find(b"\0" + name + b"\0")
    if at < 0:
        raise ValueError(f"no symbol {name.decode()} in the library")
    table = elf[symtab[4] : symtab[4] + symtab[5]]
    for st_name, _, _, shndx, value, _ in struct.iter_unpack("<IBBHQQ", table):
        if st_name == at + 1 and 0 < shndx < 0xFF00:  # defined in a section
            section = sections[shndx]
            return value - section[3] + section[4]  # address -> file offset
    raise ValueError(f"symbol {name.decode()} is named but not defined")


def patch_offset(library: Path) -> int:
    """The file offset of YNNPACK's ISA query in `library`, checked to be the code this script
    rewrites (else ValueError: a jaxlib it was not written for)."""
    with open(library, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as elf:
        offset = symbol_offset(elf, SYMBOL)
        if elf[offset : offset + len(PROLOGUE)] != PROLOGUE:
            raise ValueError(f"unexpected code at {SYMBOL.decode()} in {library}: not the jaxlib "
                             "bench/avx2.py was written for (see pyproject.toml)")  # fmt: skip
    return offset


def write_copy(out: Path) -> Path:
    """Copies the installed jaxlib into `out/jaxlib` and patches its YNNPACK's ISA query. The
    installed library is checked first, so a jaxlib this does not fit leaves nothing behind."""
    source, target = installed_jaxlib(), out / "jaxlib"
    if target.exists():
        raise FileExistsError(f"{target} exists; give an empty directory")
    offset = patch_offset(source / LIBRARY)
    shutil.copytree(source, target, symlinks=True)
    with open(target / LIBRARY, "r+b") as file:
        file.seek(offset)
        file.write(RETURN_AVX2)
    return target


def main(argv: list[str] | None = None) -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("out", type=Path, help="directory to hold the copy (DIR/jaxlib)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    target = write_copy(args.out)
    caps = "XLA_FLAGS=--xla_cpu_max_isa=AVX2 ATEN_CPU_CAPABILITY=avx2"
    print(f"wrote {target}; run with\n  PYTHONPATH={args.out.resolve()} {caps} python -m ...")


if __name__ == "__main__":
    main()
