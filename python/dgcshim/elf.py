"""The two facts read from shared objects without loading them: their
DT_NEEDED entries, and the build facts libdgcshim.so keeps in its bytes.
ELF64 little-endian only (x86-64, aarch64), standard library only."""
import json
import struct

MARKER = b"DGCSHIM-BUILD-INFO "


def build_info(path):
    """The JSON object libdgcshim.so's core/build.c holds, or None."""
    with open(path, "rb") as f:
        data = f.read()
    at = data.find(MARKER)
    if at < 0:
        return None
    end = data.find(b"\0", at)
    try:
        return json.loads(data[at + len(MARKER):end].decode())
    except ValueError:
        return None


def needed(path):
    """The DT_NEEDED names of an ELF64 shared object, in order; None when it is not one."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads, dynamic = [], None
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
        if p_type == 1:  # PT_LOAD: maps addresses back to file offsets
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == 2:  # PT_DYNAMIC
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        return []

    def offset_of(addr):
        for vaddr, off, size in loads:
            if vaddr <= addr < vaddr + size:
                return off + addr - vaddr
        return None

    strtab, names = None, []
    for at in range(dynamic[0], dynamic[0] + dynamic[1], 16):
        tag, val = struct.unpack_from("<qQ", data, at)
        if tag == 0:
            break
        if tag == 5:  # DT_STRTAB
            strtab = offset_of(val)
        elif tag == 1:  # DT_NEEDED
            names.append(val)
    if strtab is None:
        return []
    out = []
    for off in names:
        end = data.find(b"\0", strtab + off)
        out.append(data[strtab + off:end].decode(errors="replace"))
    return out
