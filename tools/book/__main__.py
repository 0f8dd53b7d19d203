"""python -m tools.book OUT [--lang en|zh_CN] [--junit FILE]: build the book (what `make site` runs)."""

import argparse
import pathlib
import sys

from tools.book.build import LANGS, build


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("out", type=pathlib.Path, help="folder to write")
    p.add_argument("--lang", action="append", choices=LANGS, help="an edition (default: both)")
    p.add_argument("--junit", type=pathlib.Path, default=None,
                   help="pytest junit XML of the test run, for each notebook's runtime")
    p.add_argument("--jobs", type=int, default=1, help="Sphinx's parallel jobs")
    a = p.parse_args()
    junit = a.junit if a.junit and a.junit.exists() else None
    editions = build(a.out, tuple(a.lang or LANGS), junit=junit, jobs=a.jobs)
    for ed in editions:
        print(f"book {ed.lang}: {len(ed.pages)} pages in {ed.out}, built in {ed.seconds:.1f} s, "
              f"{len(ed.warnings)} warnings")
        for w in ed.warnings:
            print(f"  {w}")
    if any(ed.warnings for ed in editions):
        sys.exit("the book has Sphinx warnings (above): fix them, a warning is a broken page")


if __name__ == "__main__":
    main()
