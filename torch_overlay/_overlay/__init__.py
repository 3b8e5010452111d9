"""Machinery of the torch_overlay patch set: import hook, cache, CLI, workflow.

Nothing in this package is a torch module; everything else under ``torch_overlay/``
mirrors a new upstream torch module (see ``series.mirrored_modules``).
"""
