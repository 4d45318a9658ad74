"""The floor for any Python implementation: read every type attribute of a
sysfs tree with os.open(dir_fd=...) and print JSON, nothing else."""

import json
import os
import sys


def read(fd: int, name: str) -> str | None:
    try:
        f = os.open(name, os.O_RDONLY, dir_fd=fd)
    except OSError:
        return None
    try:
        return os.read(f, 4096).decode().rstrip("\n")
    finally:
        os.close(f)


def main(root: str) -> None:
    bus = os.path.join(root, "class", "mdev_bus")
    out = {}
    for parent in sorted(os.listdir(bus)):
        tfd = os.open(os.path.join(bus, parent, "mdev_supported_types"), os.O_RDONLY)
        types = {}
        for type_id in sorted(os.listdir(tfd)):
            dfd = os.open(type_id, os.O_RDONLY | os.O_DIRECTORY, dir_fd=tfd)
            types[type_id] = {
                k: read(dfd, k)
                for k in ("available_instances", "device_api", "name", "description")
            }
            os.close(dfd)
        os.close(tfd)
        out[parent] = types
    sys.stdout.write(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
