"""python -m tools.site OUT [--junit FILE]: build the static site of the series (make site)."""

import argparse
import pathlib

from tools.site import build


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("out", type=pathlib.Path, help="folder to write (replaced if it exists)")
    p.add_argument("--junit", type=pathlib.Path, default=None,
                   help="pytest junit XML of the test run, for each notebook's runtime")
    args = p.parse_args()
    junit = args.junit if args.junit and args.junit.exists() else None
    report = build(args.out, junit=junit)
    print(f"site: {len(report.pages)} pages, {report.size_bytes / 2**20:.1f} MiB in {args.out}, "
          f"built in {report.seconds:.1f} s; runtimes {'from ' + str(junit) if junit else 'not measured'}")


if __name__ == "__main__":
    main()
