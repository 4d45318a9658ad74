"""Host-side helpers of lab.sh that are clearer in Python than in shell.

    untar-image ABI DEST     read `dpkg-deb --fsys-tarfile linux-image-...deb` on stdin and
                             extract vmlinuz, config, modules.builtin and the .ko files of the
                             few module folders the guest needs (flat, into DEST/ko)
    vmlinux VMLINUZ OUT      the uncompressed ELF vmlinux out of a bzImage (QEMU boots it
                             directly through its PVH note: ~3.5 s faster per boot under TCG)
    modorder KODIR BUILTIN ROOT...
                             print the insmod order (dependencies first) for ROOT modules,
                             computed from each .ko's `.modinfo depends=`
    summary JUNIT            print "P F E S" (passed failed errors skipped) of a junit XML

Standard library only; run with any Python >= 3.9.  research/mtty-lab.md has the recipe.
"""

from __future__ import annotations

import lzma
import os
import re
import shutil
import sys
import tarfile
import xml.etree.ElementTree as ET

# Module folders of the image package that hold everything the guest loads:
# vfio + mdev (mtty's dependencies) and the virtio/9p chain of the host-root share.
MODULE_DIRS = (
    "drivers/vfio",
    "drivers/virtio",
    "net/9p",
    "fs/9p",
    "fs/netfs",
    "fs/fscache",
)

_DEPENDS_RE = re.compile(rb"(?:^|\0)depends=([^\0]*)\0")


def _module_name(filename: str) -> str:
    """Kernel module name of a file: basename without .ko, dashes as underscores."""
    return os.path.basename(filename).removesuffix(".ko").replace("-", "_")


def untar_image(abi: str, dest: str) -> int:
    boot = {
        f"./boot/vmlinuz-{abi}": "vmlinuz",
        f"./boot/config-{abi}": "config",
        f"./lib/modules/{abi}/modules.builtin": "modules.builtin",
    }
    prefixes = tuple(f"./lib/modules/{abi}/kernel/{d}/" for d in MODULE_DIRS)
    os.makedirs(os.path.join(dest, "ko"), exist_ok=True)
    found = set()
    with tarfile.open(fileobj=sys.stdin.buffer, mode="r|") as archive:
        for member in archive:
            if not member.isfile():
                continue
            if member.name in boot:
                target = os.path.join(dest, boot[member.name])
            elif member.name.startswith(prefixes) and member.name.endswith(".ko"):
                target = os.path.join(dest, "ko", _module_name(member.name) + ".ko")
            else:
                continue
            source = archive.extractfile(member)
            assert source is not None
            with open(target, "wb") as out:
                shutil.copyfileobj(source, out)
            found.add(member.name)
    missing = sorted(n for n in boot if n not in found)
    if missing:
        print(f"labtool: not in the image package: {', '.join(missing)}", file=sys.stderr)
        return 1
    return 0


def vmlinux(vmlinuz: str, out: str) -> int:
    with open(vmlinuz, "rb") as handle:
        data = handle.read()
    start = data.find(b"\xfd7zXZ\x00")
    if start < 0:
        print(f"labtool: {vmlinuz} has no XZ payload", file=sys.stderr)
        return 1
    elf = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(data[start:])
    if not elf.startswith(b"\x7fELF"):
        print(f"labtool: the payload of {vmlinuz} is not an ELF file", file=sys.stderr)
        return 1
    with open(out, "wb") as handle:
        handle.write(elf)
    return 0


def _depends(path: str) -> list[str]:
    with open(path, "rb") as handle:
        match = _DEPENDS_RE.search(handle.read())
    if not match:
        return []
    return [_module_name(d) for d in match.group(1).decode().split(",") if d]


def modorder(kodir: str, builtin_list: str, roots: list[str]) -> int:
    available = {_module_name(f): os.path.join(kodir, f) for f in os.listdir(kodir)}
    with open(builtin_list) as handle:
        builtin = {_module_name(line.strip()) for line in handle if line.strip()}
    order: list[str] = []

    def visit(name: str, chain: tuple[str, ...]) -> None:
        if name in order or (name in builtin and name not in available):
            return
        if name in chain:
            raise SystemExit(f"labtool: module dependency cycle: {' -> '.join((*chain, name))}")
        if name not in available:
            raise SystemExit(
                f"labtool: module {name} (needed by {' -> '.join(chain) or 'the guest'}) is "
                f"neither extracted nor built in; add its folder to MODULE_DIRS"
            )
        for dep in _depends(available[name]):
            visit(dep, (*chain, name))
        order.append(name)

    for root in roots:
        visit(_module_name(root), ())
    print(" ".join(order))
    return 0


def summary(junit: str) -> int:
    root = ET.parse(junit).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    tests = failures = errors = skipped = 0
    for suite in suites:
        tests += int(suite.get("tests", 0))
        failures += int(suite.get("failures", 0))
        errors += int(suite.get("errors", 0))
        skipped += int(suite.get("skipped", 0))
    print(tests - failures - errors - skipped, failures, errors, skipped)
    return 0


def main(argv: list[str]) -> int:
    commands = {
        "untar-image": (untar_image, 2),
        "vmlinux": (vmlinux, 2),
        "summary": (summary, 1),
    }
    if argv[:1] == ["modorder"] and len(argv) >= 4:
        return modorder(argv[1], argv[2], argv[3:])
    if not argv or argv[0] not in commands or len(argv) - 1 != commands[argv[0]][1]:
        print(__doc__, file=sys.stderr)
        return 2
    func, _ = commands[argv[0]]
    return func(*argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
