"""An offline accelctl command run by someone who may not touch the agent's
files gets one error line naming the file, never a traceback (issue 34).

The user is real, not mocked: the command runs as root without
``CAP_DAC_OVERRIDE`` and ``CAP_DAC_READ_SEARCH`` (util-linux's ``setpriv``),
on a state directory of mode 0700 owned by another user, exactly what a
non-root operator meets on a host where the unit made ``/var/lib/accel-agent``
(``StateDirectoryMode=0700``).  Dropping the capabilities instead of the uid
keeps the interpreter, which may live under root's home, executable.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.configutil import write_conf

ACCELCTL = "import sys; from accel_agent.cmd.accelctl import main; sys.exit(main())"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root and util-linux's setpriv to drop the DAC capabilities",
)


@pytest.mark.parametrize(
    "command",
    [
        ["release", "vm-1"],
        ["release", "vm-1", "--remove"],
        ["allocate", "vm-1", "--count", "1"],
        ["detach", "vm-1"],
        ["recover"],
        ["adopt", "40aeb72c-55a4-4f3f-bd02-1aaa8f0edc10"],
    ],
    ids=lambda c: "-".join(c[:2]),
)
def test_offline_mutation_without_permission_is_one_error_line(tmp_path, command):
    sysfs = tmp_path / "sys"
    sysfs.mkdir()
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    os.chown(state, 1234, 1234)  # someone else's, as root's is to an operator
    conf = write_conf(
        str(tmp_path / "a.conf"),
        f"""
        state_dir = {state}
        [api]
        socket_path = {tmp_path}/api.sock
        [devices]
        enabled_mdev_types = mtty-2
        """,
        str(sysfs),
    )
    proc = subprocess.run(
        ["setpriv", "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search",
         sys.executable, "-c", ACCELCTL, "--config-file", conf, "--offline", *command],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: {state}/")
    assert "permission denied" in lines[0] and "run it as root" in lines[0]
    assert os.listdir(state) == []  # nothing was made there
