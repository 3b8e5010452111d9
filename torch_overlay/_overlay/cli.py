"""``python -m torch_overlay``: status, edit, refresh, materialize, install-pth, package,
rebase-check."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import sysconfig
from pathlib import Path

from . import importer, materialize, series, workflow
from .errors import OverlayError


def _status(args) -> int:
    info: dict = {
        "base": series.installed_base(),
        "supported_bases": series.supported_bases(),
        "series_hash": series.series_hash(),
        "patches_dir": str(series.patches_dir()),
        "active": importer.is_active(),
    }
    try:
        torch_root, torch_version = importer.find_torch()
        info["installed_torch"] = torch_version
        info["torch_location"] = str(torch_root / "torch")
    except OverlayError as e:
        info["installed_torch"] = None
        info["torch_location"] = str(e)
        torch_version = None
    cache = materialize.default_cache_root()
    if torch_version:
        cache = cache / f"torch-{torch_version}-{info['series_hash'][:16]}"
    info["cache"] = str(cache)
    info["cache_built"] = (cache / materialize.MANIFEST).exists()
    info["groups_served"] = list(series.selected_groups())
    info["patches"] = [
        {"name": p.name, "subject": p.subject, "group": p.group}
        for p in series.served_series()
    ]
    info["mirrored_modules"] = sorted(series.mirrored_modules())
    info["compat_modules"] = sorted(series.compat_modules())
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"base torch:       {info['base']} (supported: {', '.join(info['supported_bases'])})")
    print(f"installed torch:  {info['installed_torch']} ({info['torch_location']})")
    print(f"overlay active:   {'yes' if info['active'] else 'no'}")
    print(f"series hash:      {info['series_hash'][:16]}")
    print(f"groups served:    {', '.join(info['groups_served'])} ({series.GROUPS_ENV})")
    print(f"cache:            {info['cache']} ({'built' if info['cache_built'] else 'not built'})")
    print(f"patches ({len(info['patches'])}, {info['patches_dir']}):")
    group = None
    for p in info["patches"]:
        if p["group"] != group:
            group = p["group"]
            print(f"  group {group}:")
        print(f"  {p['name']}\n      {p['subject']}")
    print(f"mirrored new modules ({len(info['mirrored_modules'])}):")
    for name in info["mirrored_modules"]:
        print(f"  {name}")
    print(f"compat layer, backport only ({len(info['compat_modules'])}):")
    for name in info["compat_modules"]:
        print(f"  {name}")
    return 0


def _materialize(args) -> int:
    torch_root, torch_version = importer.find_torch()
    importer.check_torch_version(torch_version, str(torch_root / "torch"))
    tree = materialize.materialize(
        torch_root, torch_version, series.series_hash(), force=args.force
    )
    print(tree.root)
    return 0


def _edit(args) -> int:
    work = workflow.edit(
        Path(args.work_dir or workflow.default_work_dir(args.base)),
        force=args.force,
        base=args.base,
    )
    print(f"patched torch sources checked out in {work}; one commit per patch on top of tag {workflow.BASE_TAG}")
    return 0


def _refresh(args) -> int:
    names = workflow.refresh(
        Path(args.work_dir or workflow.default_work_dir(args.base)), base=args.base
    )
    print(f"wrote {len(names)} patches to {series.patches_dir(args.base)}")
    for name in names:
        print(f"  {name}")
    return 0


def _install_pth(args) -> int:
    target = Path(sysconfig.get_path("purelib")) / "torch_overlay.pth"
    shutil.copyfile(series.REPO_ROOT / "torch_overlay.pth", target)
    print(target)
    return 0


def _package(args) -> int:
    # torch._dynamo.package_trust is a mirrored module: served by the overlay.
    if not importer.is_active():
        importer.activate()
    from torch._dynamo import package_trust

    return package_trust.main(args.package_args)


def _rebase_check(args) -> int:
    from . import rebase_check

    if args.matrix:
        reports = [json.loads(path.read_text()) for path in args.matrix]
        print(rebase_check.matrix_markdown(reports), end="")
        return 0
    if not args.release:
        raise OverlayError("rebase-check needs a torch release (or --matrix REPORT.json...)")
    json_path = args.json or rebase_check.DEFAULT_CACHE_ROOT / args.release / "report.json"
    report = rebase_check.run(
        args.release, args.cache_dir, args.base_wheel_dir, json_path, args.markdown
    )
    print(report.table(), end="")
    print(f"report: {json_path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_overlay", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("status", help="base, installed torch, patches, cache")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=_status)
    p = sub.add_parser("materialize", help="build the patched-source cache now")
    p.add_argument("--force", action="store_true")
    p.set_defaults(fn=_materialize)
    base_help = (
        "the torch release whose series (patches/v<BASE>/) to work on; default: the "
        "installed torch's (supported: " + ", ".join(series.supported_bases()) + ")"
    )
    work_help = "the edit tree (default: .overlay-work, .overlay-work-<BASE> for another base)"
    p = sub.add_parser("edit", help="check the series out into a git tree")
    p.add_argument("work_dir", nargs="?", help=work_help)
    p.add_argument("--base", help=base_help)
    p.add_argument("--force", action="store_true", help="replace an existing tree")
    p.set_defaults(fn=_edit)
    p = sub.add_parser("refresh", help="regenerate the patches from the edit tree")
    p.add_argument("work_dir", nargs="?", help=work_help)
    p.add_argument("--base", help=base_help)
    p.set_defaults(fn=_refresh)
    p = sub.add_parser("install-pth", help="install torch_overlay.pth into this environment")
    p.set_defaults(fn=_install_pth)
    p = sub.add_parser("package", help="sign, verify or inspect a compile package (torch._dynamo.package_trust)")
    p.add_argument("package_args", nargs=argparse.REMAINDER, help="sign|verify|inspect PATH ...")
    p.set_defaults(fn=_package)
    p = sub.add_parser("rebase-check", help="carry the series onto another torch release and report per patch and per group")
    p.add_argument("release", nargs="?", help="the torch release to check, e.g. 2.9.1")
    p.add_argument("--matrix", type=Path, nargs="+", metavar="REPORT",
                   help="print one markdown table of these JSON reports instead")
    p.add_argument("--json", type=Path, help="where to write the JSON report (default: build/rebase/RELEASE/report.json)")
    p.add_argument("--markdown", type=Path, help="where to write the report's table as markdown")
    p.add_argument("--cache-dir", type=Path, default=series.REPO_ROOT / "build" / "rebase",
                   help="where releases' wheels are downloaded, one directory each")
    p.add_argument("--base-wheel-dir", type=Path, default=series.REPO_ROOT / "build" / "wheel-src",
                   help="where the base release's wheel is (build_scripts/build_wheel.py downloads it there)")
    p.set_defaults(fn=_rebase_check)
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except OverlayError as e:
        print(f"torch_overlay: error: {e}", file=sys.stderr)
        return 1
