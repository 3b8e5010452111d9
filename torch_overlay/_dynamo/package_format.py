"""The on-disk format of compile packages and aot_compile archives.

A compile package is a directory, and an aot_compile archive a zip file, of
the same kinds of files: a manifest that lists every other file with its
sha256, optionally an Ed25519 signature of the manifest's bytes, Dynamo's
entries, and the graph and kernel files those entries refer to. This module
names them once, for every module that writes, reads, checks or moves a package
(torch/_dynamo/package.py, package_artifacts.py, package_trust.py,
package_storage.py):

* :data:`PACKAGE_FORMAT_VERSION`: the manifest's ``format_version``;
* :data:`MANIFEST`, :data:`SIGNATURE_FILE` and :data:`SIGNATURE_FORMAT`: the
  manifest, its signature file and that file's ``format``;
* :data:`DYNAMO_FILE`: the pickled list of Dynamo entries;
* :data:`GRAPH_PREFIX` / :data:`GRAPH_SUFFIX` and :data:`KERNEL_PREFIX` /
  :data:`KERNEL_SUFFIX`: where a graph's bytes and a CPU kernel's shared
  object are, by artifact name and by the sha256 of the kernel's bytes;
  :func:`graph_file`, :func:`graph_name` and :func:`kernel_file` spell and read
  those file names.
"""

from typing import Optional

# The manifest's format_version: a package of another version is refused, not
# read as this one. 2: resume entries are keyed by a fingerprint of their code,
# modules compiled through the inline wrapper by their class (NOTE: [Keys of
# package entries] in torch/_dynamo/package_entries.py). 3: each entry records what it
# was derived from (NOTE: [What an entry was derived from] in
# torch/_dynamo/package_sources.py). 4: a recorded decision about a code says
# whether it skips the code or runs only its cache entries (NOTE: [Frames Dynamo
# skips] in torch/_dynamo/package_recording.py), and an aot_compile'd function's code and
# its closure's codes are recorded by package_sources.code_fingerprint, the
# digest entries' records use (NOTE: [Finding a local function again] in
# torch/_dynamo/aot_compile.py).
PACKAGE_FORMAT_VERSION = 4

MANIFEST = "manifest.json"
SIGNATURE_FILE = "manifest.json.sig"
# The "format" field of the signature file's JSON record.
SIGNATURE_FORMAT = 1

DYNAMO_FILE = "dynamo.bin"
GRAPH_PREFIX, GRAPH_SUFFIX = "graphs/", ".bin"
KERNEL_PREFIX, KERNEL_SUFFIX = "kernels/", ".so"


def graph_file(name: str) -> str:
    """The package file of the graph artifact ``name``."""
    return f"{GRAPH_PREFIX}{name}{GRAPH_SUFFIX}"


def graph_name(file: str) -> Optional[str]:
    """The graph artifact a package file holds, or None for any other file."""
    if file.startswith(GRAPH_PREFIX) and file.endswith(GRAPH_SUFFIX):
        return file[len(GRAPH_PREFIX) : -len(GRAPH_SUFFIX)]
    return None


def kernel_file(digest: str) -> str:
    """The package file of the CPU kernel whose hash is ``digest``."""
    return f"{KERNEL_PREFIX}{digest}{KERNEL_SUFFIX}"
