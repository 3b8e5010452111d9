# Owner(s): ["module: dynamo"]
"""Recursive dict-tag guards on torch 2.7.1 (config.use_recursive_dict_tags_for_guards).

The backport lives in the compat layer (torch._dynamo._dict_tag_guards and its C
extension) and a compat patch to guards.py, so these tests are not exported.
Every guard manager built with the flag on is compared against one built with
it off on the same frame: after each mutation of the model both must decide
alike (NOTE: [Recursive dict tags on torch 2.7.1]).
"""

import os
import tempfile

import torch
import torch._dynamo.test_case
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch._dynamo.guards import get_guard_fail_reason_helper
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)
from torch.testing._internal.fresh_process import run_code


class Block(torch.nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.ln = torch.nn.LayerNorm(d)
        self.fc = torch.nn.Linear(d, d)

    def forward(self, x):
        return x + self.fc(self.ln(x))


class Stack(torch.nn.Module):
    def __init__(self, n=4):
        super().__init__()
        self.layers = torch.nn.ModuleList(Block() for _ in range(n))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class WithList(torch.nn.Module):
    """A block beside a module whose forward reads a list attribute."""

    def __init__(self):
        super().__init__()
        self.block = Block()
        self.scaled = Scaled()

    def forward(self, x):
        return self.scaled(self.block(x))


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scales = [2.0, 3.0]

    def forward(self, x):
        return x * self.scales[0]


def reference_frame(model, x):
    return model(x)


def tagged_frame(model, x):
    return model(x)


def guard_manager(model, x, recursive):
    """The guard manager of a frame calling ``model`` on ``x``: built with the
    flag on or off, each in its own frame (a reset would drop the globals the
    other manager's guards read)."""
    frame = tagged_frame if recursive else reference_frame
    with torch._dynamo.config.patch(use_recursive_dict_tags_for_guards=recursive):
        torch.compile(frame, backend="eager")(model, x)
    (entry,) = _debug_get_cache_entry_list(frame.__code__)
    return entry.guard_manager


def mutate_eps(m):
    m.layers[1].ln.eps = 1e-3


def mutate_weight_dtype(m):
    m.layers[2].fc.weight = torch.nn.Parameter(m.layers[2].fc.weight.double())


def mutate_class(m):
    m.layers[0].ln.__class__ = type("OtherLayerNorm", (torch.nn.LayerNorm,), {})


def mutate_forward(m):
    m.layers[3].forward = lambda x: x


def mutate_append(m):
    m.layers.append(Block())


def mutate_unguarded(m):
    m.layers[1].note = "not read by forward"


def mutate_requires_grad(m):
    m.layers[1].fc.bias.requires_grad_(False)


def mutate_replace_submodule(m):
    m.layers[2].fc = torch.nn.Linear(8, 8)


MUTATIONS = {
    "eps": (mutate_eps, False),
    "weight_dtype": (mutate_weight_dtype, False),
    "class": (mutate_class, False),
    "forward_in_dict": (mutate_forward, False),
    "append": (mutate_append, False),
    "unguarded_attr": (mutate_unguarded, True),
    # 2.7.1 skips a tensor's guards while the dict holding it is unchanged
    # (config.skip_tensor_guards_with_matching_dict_tags): so do subtrees.
    "requires_grad_in_place": (mutate_requires_grad, True),
    "replace_submodule": (mutate_replace_submodule, True),
}


class TestDictTagGuards(torch._dynamo.test_case.TestCase):
    def test_a_module_tree_is_one_subtree(self):
        model, x = Stack(), torch.randn(2, 8)
        gm = guard_manager(model, x, recursive=True)
        self.assertEqual(list(gm.dict_tag_subtrees.by_source), ["L['model']"])
        subtree = gm.dict_tag_subtrees.by_source["L['model']"]
        f_locals = {"model": model, "x": x}
        for _ in range(3):
            self.assertTrue(gm.check(f_locals))
        self.assertEqual(subtree.guard.recorded, 1)
        self.assertGreaterEqual(subtree.guard.hits, 3)
        self.assertGreater(subtree.guard.size, 0)

    def test_flag_off_builds_no_subtree(self):
        gm = guard_manager(Stack(), torch.randn(2, 8), recursive=False)
        self.assertIsNone(gm.dict_tag_subtrees)

    @parametrize("mutation", list(MUTATIONS))
    def test_decides_like_the_full_tree(self, mutation):
        mutate, expected = MUTATIONS[mutation]
        x = torch.randn(2, 8)
        model = Stack()
        reference = guard_manager(model, x, recursive=False)
        tagged = guard_manager(model, x, recursive=True)
        f_locals = {"model": model, "x": x}
        self.assertTrue(reference.check(f_locals))
        self.assertTrue(tagged.check(f_locals))
        mutate(model)
        self.assertEqual(reference.check(f_locals), expected)
        self.assertEqual(tagged.check(f_locals), expected)
        self.assertEqual(tagged.check(f_locals), expected)  # from a new snapshot

    def test_failure_reason_names_the_subtree_guard(self):
        model, x = Stack(), torch.randn(2, 8)
        gm = guard_manager(model, x, recursive=True)
        f_locals = {"model": model, "x": x}
        self.assertTrue(gm.check(f_locals))
        mutate_eps(model)
        self.assertFalse(gm.check(f_locals))
        reason = get_guard_fail_reason_helper(gm, f_locals, None)
        self.assertIn(
            "_modules['layers']._modules['1']._modules['ln'].eps == 1e-05", reason
        )

    def test_a_list_attribute_keeps_its_module_out(self):
        model, x = WithList(), torch.randn(2, 8)
        gm = guard_manager(model, x, recursive=True)
        self.assertEqual(
            list(gm.dict_tag_subtrees.by_source), ["L['model']._modules['block']"]
        )
        f_locals = {"model": model, "x": x}
        self.assertTrue(gm.check(f_locals))
        model.scaled.scales[0] = 4.0  # no dict changes: the list's guards see it
        self.assertFalse(gm.check(f_locals))

    def test_one_snapshot_per_layer_for_a_compiled_layer(self):
        model, x = Stack(), torch.randn(2, 8)
        torch._dynamo.reset()
        with torch._dynamo.config.patch(use_recursive_dict_tags_for_guards=True):
            for _ in range(2):
                for layer in model.layers:
                    torch.compile(layer, backend="eager")(x)
        entries = _debug_get_cache_entry_list(Block.forward.__code__)
        self.assertEqual(len(entries), 1)
        subtree = entries[0].guard_manager.dict_tag_subtrees.by_source["L['self']"]
        self.assertEqual(subtree.guard.recorded, len(model.layers))
        self.assertGreaterEqual(subtree.guard.hits, len(model.layers))

    def test_dicts_that_keep_changing_stop_recording(self):
        from torch._dynamo._dict_tag_guards import MAX_RECORDS

        model, x = Stack(), torch.randn(2, 8)
        gm = guard_manager(model, x, recursive=True)
        subtree = gm.dict_tag_subtrees.by_source["L['model']"]
        f_locals = {"model": model, "x": x}
        for i in range(MAX_RECORDS + 3):
            model.layers[0].step = i
            self.assertTrue(gm.check(f_locals))
        self.assertFalse(subtree.recording)
        self.assertEqual(subtree.guard.recorded, 0)
        mutate_eps(model)
        self.assertFalse(gm.check(f_locals))

    def test_dead_root_is_not_matched(self):
        x = torch.randn(2, 8)
        model = Stack()
        gm = guard_manager(model, x, recursive=True)
        subtree = gm.dict_tag_subtrees.by_source["L['model']"]
        self.assertTrue(gm.check({"model": model, "x": x}))
        del model
        other = Stack()
        self.assertTrue(gm.check({"model": other, "x": x}))
        mutate_eps(other)
        self.assertFalse(gm.check({"model": other, "x": x}))
        self.assertGreaterEqual(subtree.guard.misses, 2)


LOAD = r"""
import sys
import torch
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch._dynamo.guards import get_guard_fail_reason_helper
from torch.testing._internal.fresh_process import write_report
sys.path.insert(0, sys.argv[3])
from test_dict_tag_guards import Stack, mutate_eps

mode, package_dir = sys.argv[1:3]
torch.manual_seed(0)
model, x = Stack(), torch.randn(2, 8)
compiled = torch.compile(model, backend="eager", package=package_dir)
if mode == "save":
    compiled(x)
    compiled.save_package()
    write_report({})
    raise SystemExit
torch._dynamo.config.use_recursive_dict_tags_for_guards = True
compiled.load_package()
with torch.compiler.set_stance("fail_on_recompile"):
    same = [torch.allclose(compiled(x), model(x)) for _ in range(3)]
    (entry,) = _debug_get_cache_entry_list(Stack.forward.__code__)
    subtree = entry.guard_manager.dict_tag_subtrees.by_source["L['self']"]
    hits = subtree.guard.hits
    mutate_eps(model)
    try:
        compiled(x)
        error = None
    except RuntimeError as e:
        error = str(e)
    reason = get_guard_fail_reason_helper(entry.guard_manager, {"self": model, "x": x}, None)
write_report({"same": same, "hits": hits, "error": error, "reason": reason})
"""


class TestDictTagGuardsPackage(torch._dynamo.test_case.TestCase):
    def test_loaded_package_checks_by_dict_tags(self):
        here = os.path.dirname(os.path.abspath(__file__))
        with tempfile.TemporaryDirectory() as tmp:
            package = os.path.join(tmp, "pkg")
            run_code(LOAD, "save", package, here, cwd=tmp)
            report = run_code(LOAD, "load", package, here, cwd=tmp)
        self.assertEqual(report["same"], [True, True, True])
        self.assertGreaterEqual(report["hits"], 2)
        self.assertIn("Detected recompile", report["error"])
        self.assertIn("_modules['1']._modules['ln'].eps == 1e-05", report["reason"])


instantiate_parametrized_tests(TestDictTagGuards)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
