#!/usr/bin/env bash
# `make deb`: the Debian package, built by dpkg-buildpackage (debhelper and
# dh-virtualenv) from the sdist `make dist` wrote, in build/deb; the .deb
# lands in dist/.  The version is the Python package's (accel_agent/__init__.py),
# in Debian's spelling (1.2.0rc1 -> 1.2.0~rc1).
set -euo pipefail
cd "$(dirname "$0")/.."

shopt -s nullglob
sdists=(dist/accel_agent-*.tar.gz)
if [ "${#sdists[@]}" -ne 1 ]; then
    echo "build-deb: expected one sdist in dist/ (run make dist), found ${#sdists[@]}" >&2
    exit 1
fi
sdist=${sdists[0]}
version=${sdist#dist/accel_agent-}
version=${version%.tar.gz}
# PEP 440 pre-releases sort before the release; Debian's ~ does the same.
debversion=$(sed -E 's/\.?(a|b|rc|dev)([0-9]+)/~\1\2/g' <<<"$version")

work=build/deb
rm -rf "$work"
mkdir -p "$work"
tar -xzf "$sdist" -C "$work"
src="$work/accel_agent-$version"
cp -r "$src/packaging/debian" "$src/debian"
# The maintainer is the control file's, unless whoever builds the package for
# their fleet names themselves the Debian way (DEBFULLNAME and DEBEMAIL, as dch
# reads them): the changelog's signature says the same.
maintainer=$(sed -n 's/^Maintainer: //p' "$src/debian/control")
if [ -n "${DEBEMAIL:-}" ]; then
    maintainer="${DEBFULLNAME:-${maintainer%% <*}} <$DEBEMAIL>"
    sed -i "s|^Maintainer: .*|Maintainer: $maintainer|" "$src/debian/control"
fi
cat >"$src/debian/changelog" <<CHANGELOG
accel-agent ($debversion) unstable; urgency=medium

  * accel-agent $version, built from its sdist.

 -- $maintainer  $(date -R)
CHANGELOG

# The man pages and the bash completion, from the parsers of the code being
# packaged, by the build tools of the repository's venv (make venv).
python=${ACCEL_BUILD_PYTHON:-.venv/bin/python}
PYTHONPATH="$src" "$python" "$src/tools/genman.py" "$src/debian/generated"

(cd "$src" && dpkg-buildpackage --build=binary --no-sign)
rm -f dist/accel-agent_*.deb dist/accel-agent-simulator_*.deb
mv "$work"/accel-agent_"$debversion"_*.deb "$work"/accel-agent-simulator_"$debversion"_*.deb dist/
ls dist/accel-agent_"$debversion"_*.deb dist/accel-agent-simulator_"$debversion"_*.deb
