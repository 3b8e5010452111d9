"""The compat layer: what only the backport to torch 2.7.1 needs, never exported.

Upstream, ``torch._C`` binds ``CInterpreter.serialize`` / ``deserialize`` itself
(torch/csrc/functorch/init.cpp). Torch 2.7.1's ``torch._C`` cannot be rebuilt
here, so the compat layer supplies them: ``csrc/`` holds the glue that adds the two
methods to the class torch._C bound, built with the upstream C++ of
``torch_overlay/csrc/`` into ``torch._functorch._interpreter_serialization_C``, and
``_functorch/_interpreter_serialization.py`` loads it.

Modules here are laid out like the mirrored ones (``compat/X/y.py`` is served as
``torch.X.y``); the overlay serves them and the patched wheel ships them (see
NOTE: [The compat layer] in ``torch_overlay/_overlay/series.py``), and the upstream
export never includes them.
"""
