"""The ``accelctl`` console script.

A plain listing into a pipe (``accelctl types --json | jq``) is answered by
the running daemon before accelctl's parser and modules are even imported
(accel_agent.cmd.plain_listing); everything else is accel_agent.cmd.ctl.
"""

from __future__ import annotations

import sys


def main() -> int:
    from accel_agent.cmd import plain_listing

    status = plain_listing.answer(sys.argv[1:])
    if status is not None:
        return status
    from accel_agent.cmd import ctl

    return ctl.run()


if __name__ == "__main__":
    sys.exit(main())
