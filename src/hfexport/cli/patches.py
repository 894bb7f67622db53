"""`hfexport patches`: every registered patch and FX fix, with why it exists and when it can go."""

from __future__ import annotations

from ..registry import FX_NODE_FIXES, FX_PROGRAM_FIXES, PATCHES, load_builtin_workarounds


def run(args) -> int:
    load_builtin_workarounds()
    entries = [("patch", p) for p in PATCHES.values()]
    entries += [("fx program fix", f) for f in FX_PROGRAM_FIXES.values()]
    entries += [("fx node fix", f) for f in FX_NODE_FIXES.values()]
    if args.backend:
        entries = [(k, e) for k, e in entries if args.backend in e.backends]
    if not entries:
        print("no patches or fixes registered" + (f" for {args.backend}" if args.backend else ""))
        return 0
    for kind, entry in sorted(entries, key=lambda item: (item[1].backends, item[1].name)):
        print(f"{entry.name}  [{kind}; {', '.join(entry.backends)}]")
        targets = getattr(entry, "targets", None)
        if targets:
            print(f"    targets:     {', '.join(targets)}")
        print(f"    why:         {entry.reason}")
        if entry.upstream:
            print(f"    upstream:    {entry.upstream}")
        if entry.seen_with:
            print(f"    seen with:   {', '.join(f'{k} {v}' for k, v in entry.seen_with.items())}")
        if entry.remove_when:
            print(f"    remove when: {entry.remove_when}")
        if getattr(entry, "is_available", True) is False:
            print("    inactive:    its package is not installed")
    return 0
