"""Host-side helpers of lab.sh that are clearer in Python than in shell.

    untar-image ABI DEST     read `dpkg-deb --fsys-tarfile linux-image-...deb` on stdin and
                             extract vmlinuz, config, modules.builtin and the .ko files of the
                             few module folders the guest needs (flat, into DEST/ko; a .ko.xz,
                             as Debian's 6.12 ships them, is stored decompressed: busybox insmod
                             takes plain .ko files only)
    vmlinux VMLINUZ OUT      the uncompressed ELF vmlinux out of a bzImage (QEMU boots it
                             directly through its PVH note: ~3.5 s faster per boot under TCG);
                             an XZ payload (6.1) is unpacked here, a zstd one (6.12) by `zstd`
    modorder KODIR BUILTIN ROOT...
                             print the insmod order (dependencies first) for ROOT modules,
                             computed from each .ko's `.modinfo depends=`
    summary JUNIT            print "P F E S" (passed failed errors skipped) of a junit XML
    requirements PYPROJECT [EXCLUDE...]
                             print the project's runtime dependencies and its pytest, one per
                             line, leaving out the EXCLUDE distributions (what a lab rootfs
                             takes from Debian instead, e.g. libvirt-python)

Standard library only; run with any Python >= 3.11.  tests/realkernel/README.md
("How it works") has the recipe.
"""

from __future__ import annotations

import lzma
import os
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import tomllib
import xml.etree.ElementTree as ET

# Module folders (and single modules) of the image package that hold everything the
# guest loads: vfio + mdev (mtty's dependencies) and the virtio/9p chain of the shares.
MODULE_DIRS = (
    "drivers/vfio",
    "drivers/virtio",
    "net/9p",
    "fs/9p",
    "fs/netfs",
    "fs/fscache",
    # the overlay that makes a lab rootfs shared read-only over 9p writable in the guest
    "fs/overlayfs",
    # lab igb: QEMU's 82576 SR-IOV NIC (igb, igbvf), what igb depends on (dca,
    # i2c-algo-bit; ptp, pps and hwmon are built in), and vfio-pci's irqbypass
    "drivers/net/ethernet/intel/igb",
    "drivers/net/ethernet/intel/igbvf",
    "drivers/dca",
    "drivers/i2c/algos",
    "virt/lib",
    # a lab whose guest reboots keeps what it wrote on a virtio disk (ext4): the
    # block driver, the filesystem, and the crc32c its metadata checksums need (ext4
    # asks the crypto API for it at mount time; nothing in the initramfs can modprobe)
    "drivers/block/virtio_blk.ko",
    "fs/ext4",
    "fs/jbd2",
    "fs/mbcache.ko",
    "lib/crc16.ko",
    "crypto/crc32c_generic.ko",
)

_DEPENDS_RE = re.compile(rb"(?:^|\0)depends=([^\0]*)\0")


def _module_name(filename: str) -> str:
    """Kernel module name of a file: basename without .ko(.xz), dashes as underscores."""
    return os.path.basename(filename).removesuffix(".xz").removesuffix(".ko").replace("-", "_")


def untar_image(abi: str, dest: str) -> int:
    boot = {
        f"./boot/vmlinuz-{abi}": "vmlinuz",
        f"./boot/config-{abi}": "config",
        f"./lib/modules/{abi}/modules.builtin": "modules.builtin",
    }
    # A folder takes every module under it; a name ending in .ko takes that one module.
    prefixes = tuple(
        f"./lib/modules/{abi}/kernel/{d}" + ("" if d.endswith(".ko") else "/") for d in MODULE_DIRS
    )
    os.makedirs(os.path.join(dest, "ko"), exist_ok=True)
    found = set()
    with tarfile.open(fileobj=sys.stdin.buffer, mode="r|") as archive:
        for member in archive:
            if not member.isfile():
                continue
            if member.name in boot:
                target = os.path.join(dest, boot[member.name])
            elif member.name.startswith(prefixes) and member.name.endswith((".ko", ".ko.xz")):
                target = os.path.join(dest, "ko", _module_name(member.name) + ".ko")
            else:
                continue
            source = archive.extractfile(member)
            assert source is not None
            with open(target, "wb") as out:
                if member.name.endswith(".xz"):
                    out.write(lzma.decompress(source.read()))
                else:
                    shutil.copyfileobj(source, out)
            found.add(member.name)
    missing = sorted(n for n in boot if n not in found)
    if missing:
        print(f"labtool: not in the image package: {', '.join(missing)}", file=sys.stderr)
        return 1
    return 0


_XZ_MAGIC = b"\xfd7zXZ\x00"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def _bzimage_payload(data: bytes) -> bytes:
    """The compressed kernel of a bzImage, located by its boot protocol header
    (``payload_offset``/``payload_length`` at 0x248, relative to the
    protected-mode code after the setup sectors), as the bootloader sees it."""
    setup_sects = data[0x1F1] or 4
    offset, length = struct.unpack_from("<II", data, 0x248)
    start = (setup_sects + 1) * 512 + offset
    return data[start : start + length]


def vmlinux(vmlinuz: str, out: str) -> int:
    with open(vmlinuz, "rb") as handle:
        data = handle.read()
    payload = _bzimage_payload(data)
    if payload.startswith(_XZ_MAGIC):
        elf = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(payload)
    elif payload.startswith(_ZSTD_MAGIC):
        # No zstd in this Python's standard library.  The kernel's build appends
        # the uncompressed size (4 bytes) after the frame: not zstd data.
        proc = subprocess.run(
            ["zstd", "-q", "-d", "-c"], input=payload[:-4], capture_output=True, check=False
        )
        if proc.returncode != 0:
            print(f"labtool: zstd -d failed: {proc.stderr.decode().strip()}", file=sys.stderr)
            return 1
        elf = proc.stdout
    else:
        print(f"labtool: {vmlinuz} has neither an XZ nor a zstd payload", file=sys.stderr)
        return 1
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


def _distribution(requirement: str) -> str:
    """``oslo.service[threading]>=4.1`` -> ``oslo-service`` (PEP 503 normalised)."""
    name = re.split(r"[\s\[<>=!~;]", requirement.strip(), maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(pyproject: str, *exclude: str) -> int:
    with open(pyproject, "rb") as handle:
        project = tomllib.load(handle)["project"]
    test_extra = project.get("optional-dependencies", {}).get("test", [])
    wanted = [*project["dependencies"], *(r for r in test_extra if _distribution(r) == "pytest")]
    skipped = {_distribution(name) for name in exclude}
    for requirement in wanted:
        if _distribution(requirement) not in skipped:
            print(requirement)
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["requirements"] and len(argv) >= 2:
        return requirements(argv[1], *argv[2:])
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
