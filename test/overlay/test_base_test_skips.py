# Owner(s): ["module: dynamo"]
"""The test-skips of the other supported bases against the suite they name.

Every key of ``patches/v<base>/test-skips.toml`` (NOTE: [Tests skipped on
another base] in test/conftest.py) names a test file of the suite, and the
class and test it names exist there (a test by its written name, or one
parametrization of a parametrized test). A key left behind by a renamed test
would skip nothing and no one would notice; a reason must say why.

And the matcher conftest applies: a key names a test, a class, a file, or a
parametrized test as it is written, and nothing that only shares a prefix.

No subprocess and no torch_overlay import: it reads files and runs in every
environment of the suite.
"""

import ast
import importlib.util
import tomllib
from pathlib import Path

from torch._dynamo.test_case import run_tests, TestCase


REPO_ROOT = Path(__file__).resolve().parents[2]


def _skip_files() -> list[Path]:
    return sorted((REPO_ROOT / "patches").glob("v*/test-skips.toml"))


def _is_parametrized(function: ast.FunctionDef) -> bool:
    for decorator in function.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name == "parametrize":
            return True
    return False


def _classes_and_tests(path: Path) -> dict[str, dict[str, bool]]:
    """Each class of a test file with the functions it defines, and for each
    whether it is parametrized (instantiate_parametrized_tests names each
    parametrization ``<written name>_<params>``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return {
        node.name: {
            item.name: _is_parametrized(item)
            for item in node.body
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
        }
        for node in tree.body
        if isinstance(node, ast.ClassDef)
    }


def _names_a_test(name: str, tests: dict[str, bool]) -> bool:
    return name in tests or any(
        parametrized and name.startswith(f"{written}_") for written, parametrized in tests.items()
    )


def _load_conftest():
    spec = importlib.util.spec_from_file_location("_suite_conftest", REPO_ROOT / "test" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Item:
    """What the matcher reads of a pytest item."""

    def __init__(self, nodeid, written_name=None):
        self.nodeid = nodeid
        self.name = nodeid.rsplit("::", 1)[-1]

        def function():
            pass

        function.__name__ = written_name or self.name
        self.function = function
        self.skip_reasons = []

    def add_marker(self, marker):
        self.skip_reasons.append(marker.kwargs["reason"])


class TestBaseTestSkips(TestCase):
    def test_there_is_a_skip_file_for_each_other_base(self):
        # A guard for the test below: it must have something to check.
        self.assertIn("v2.6.0", [p.parent.name for p in _skip_files()])

    def test_every_key_names_a_test_of_the_suite(self):
        for skip_file in _skip_files():
            with open(skip_file, "rb") as f:
                skips = tomllib.load(f)["skip"]
            self.assertGreater(len(skips), 0, skip_file)
            for key, reason in skips.items():
                with self.subTest(base=skip_file.parent.name, key=key):
                    self.assertGreater(len(reason.split()), 3, "a reason must say why")
                    file_part, *names = key.split("::")
                    path = REPO_ROOT / file_part
                    self.assertTrue(path.is_file(), f"{file_part} is not a file of the repository")
                    if not names:
                        continue
                    classes = _classes_and_tests(path)
                    self.assertIn(names[0], classes, f"{file_part} has no class {names[0]}")
                    if len(names) > 1:
                        self.assertEqual(len(names), 2, key)
                        self.assertTrue(
                            _names_a_test(names[1], classes[names[0]]),
                            f"{names[0]} has no test {names[1]} (nor a parametrized test it is one of)",
                        )

    def test_the_matcher_takes_written_names_and_no_mere_prefix(self):
        conftest = _load_conftest()
        cls = "test/dynamo/test_x.py::TestX"
        items = {
            "parametrized": _Item(f"{cls}::test_change_how_patch", "test_change"),
            "shares_a_prefix": _Item(f"{cls}::test_change_more"),
            "pytest_param": _Item(f"{cls}::test_param[a]", "test_param"),
            "other_class": _Item("test/dynamo/test_x.py::TestY::test_change_how_patch", "test_change"),
            "in_a_file": _Item("test/dynamo/test_z.py::TestZ::test_z"),
            "file_sharing_a_prefix": _Item("test/dynamo/test_z.py2::TestZ::test_z"),
        }
        skips = {
            f"{cls}::test_change": "written name",
            f"{cls}::test_param": "pytest parametrization",
            "test/dynamo/test_z.py": "file",
        }
        original = conftest._base_test_skips
        conftest._base_test_skips = lambda: skips
        try:
            conftest.pytest_collection_modifyitems(None, list(items.values()))
        finally:
            conftest._base_test_skips = original
        self.assertEqual(
            {name: item.skip_reasons for name, item in items.items()},
            {
                "parametrized": ["written name"],
                "shares_a_prefix": [],
                "pytest_param": ["pytest parametrization"],
                "other_class": [],
                "in_a_file": ["file"],
                "file_sharing_a_prefix": [],
            },
        )


if __name__ == "__main__":
    run_tests()
