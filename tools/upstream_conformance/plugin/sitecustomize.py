"""Started by every Python process of an upstream conformance run (this folder
is on its PYTHONPATH): see NOTE: [Stand-ins in spawned processes] in
upstream_conformance_plugin.py."""

import upstream_conformance_plugin


upstream_conformance_plugin.install_test_file_finder()
