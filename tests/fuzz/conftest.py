"""Keep hypothesis' files (its cache of the constants it finds in the code, failing
examples' patches) out of the working tree: in a temporary folder for the session."""

from __future__ import annotations

import tempfile

from hypothesis.configuration import set_hypothesis_home_dir

_HOME = tempfile.TemporaryDirectory(prefix="hypothesis-")
set_hypothesis_home_dir(_HOME.name)
