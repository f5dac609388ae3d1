"""`torchdoctor checkpoint verify DIR | --latest ROOT`: is a DCP checkpoint complete?"""

from __future__ import annotations

import argparse
import json
import sys

from torchdoctor.checkpoint.verify import NotACheckpoint, Verdict, latest, verify

EXIT_COMPLETE, EXIT_TORN, EXIT_BAD = 0, 1, 2


def _line(v: Verdict) -> str:
    what = f"{v.files} shard file(s), {v.items} item(s), {v.bytes:,} bytes" + (", commit marker" if v.marker else "")
    if v.complete:
        return f"complete: {v.path} ({what})"
    return f"torn: {v.path}: " + "; ".join(v.problems)


def cmd_checkpoint(args: argparse.Namespace) -> int:
    try:
        if args.latest:
            best, seen = latest(args.path, args.require_marker)
            if args.json:
                print(json.dumps({"latest": best.to_dict() if best else None, "checked": [v.to_dict() for v in seen]}))
            else:
                for v in seen:
                    print(_line(v))
                print(f"latest complete: {best.path}" if best else f"no complete checkpoint under {args.path}")
            return EXIT_COMPLETE if best else EXIT_TORN
        v = verify(args.path, args.require_marker)
    except NotACheckpoint as exc:
        print(f"torchdoctor: checkpoint: {exc}", file=sys.stderr)
        return EXIT_BAD
    except OSError as exc:
        print(f"torchdoctor: checkpoint: {args.path}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_BAD
    print(json.dumps(v.to_dict()) if args.json else _line(v))
    return EXIT_COMPLETE if v.complete else EXIT_TORN


def add_checkpoint_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "checkpoint", help="verify DCP checkpoints: complete or torn, and the newest complete one",
        description="Check a torch.distributed.checkpoint directory: metadata readable, every shard it names "
                    "present and long enough, every rank's files there, no temporary files. Exit 0 complete, "
                    "1 torn, 2 not a checkpoint.")
    p.add_argument("action", choices=["verify"])
    p.add_argument("path", metavar="DIR", help="a checkpoint directory (with --latest: the directory of step directories)")
    p.add_argument("--latest", action="store_true", help="find the newest complete checkpoint among DIR's subdirectories")
    p.add_argument("--require-marker", action="store_true",
                   help="count a checkpoint as complete only with the commit marker of torchdoctor.checkpoint.commit")
    p.add_argument("--json", action="store_true", help="print the verdict as JSON")
    p.set_defaults(func=cmd_checkpoint)
    return p
