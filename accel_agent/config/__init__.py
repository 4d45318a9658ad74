"""The configuration room: the agent's oslo.config options, reading the
files, and the one order of checks of a configuration.

One job per module, no module importing one that imports it back
(tests/unit/test_house.py), none importing the daemon or the console
scripts:

* ``types.py``: the value types oslo.config lacks;
* ``options.py``: the core's options (what every command reads);
* ``registry.py``: the one table of every room's options, registered from
  one place, and the generator's list;
* ``files.py``: which files are the configuration, and reading local files
  safely;
* ``load.py``: parse the files into a ConfigOpts (check 1);
* ``comments.py``: a comment written after a value;
* ``lint.py``: the files as written;
* ``values.py``: every value read once, named by file and line;
* ``startchecks.py``: what else the start can refuse, in its words;
* ``check.py``: the one order of checks, for ``check-config``,
  ``accel-agent --check``, the start and every reload;
* ``cache.py``: the listings' cache of the resolved configuration.

This file imports nothing: accelctl's plain listings import ``cache.py``
and ``files.py`` alone.
"""
