"""``python -m accel_agent.simulator ...``: the simulate commands standalone."""

from accel_agent.simulator.cli import main

raise SystemExit(main())
