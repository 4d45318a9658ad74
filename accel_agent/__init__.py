"""accel-agent: the host-side owner of mediated devices (mdevs) and vGPUs."""

__version__ = "0.1.0"
