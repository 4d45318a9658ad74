"""``privsep-helper`` without eventlet's deprecation notice on its stderr.

oslo.privsep's helper imports eventlet at module import, and eventlet warns
on import (nine lines, every start of the helper, in the agent's log): an
operator can do nothing about it and the agent never uses eventlet.  This
entry point installs the filter first, then runs oslo.privsep's own
``helper_main`` unchanged; :func:`accel_agent.privileged.helper_command`
starts it as ``python -m accel_agent.privileged.helper``.
"""

from __future__ import annotations

import sys
import warnings


def main() -> int:
    warnings.filterwarnings("ignore", message=r"\s*Eventlet is deprecated", category=Warning)
    from oslo_privsep.daemon import helper_main

    helper_main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
