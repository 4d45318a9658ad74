"""Until accel_agent/mdev's writers import them from the facade (the lead's move of
PrivsepWriter/DirectWriter to mdev/writers.py): delete this file then."""

from accel_agent.privileged import (  # noqa: F401
    bind_vfio,
    set_num_vfs,
    unbind_vfio,
    write_bind_vfio,
    write_num_vfs,
    write_unbind_vfio,
)
