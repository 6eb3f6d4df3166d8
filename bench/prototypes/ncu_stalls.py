"""Summarize the warp-stall sampling of the W12 GEMM launches in an Nsight Compute source export.

    ncu -i REPORT.ncu-rep --page source --csv --print-source sass -k regex:_gemm > SRC.csv
    python bench/prototypes/ncu_stalls.py SRC.csv[.gz] OUT.md TITLE LAUNCH_NAME [LAUNCH_NAME ...]

Per launch (in export order, one name each): the share of all stall samples by reason and the ten
SASS instructions with the most samples.
"""

import collections
import csv
import gzip
import io
import sys


def main(src: str, out_path: str, title: str, *names: str) -> int:
    opener = gzip.open if src.endswith(".gz") else open
    with opener(src, "rt") as f:
        parts = f.read().split('"Kernel Name","_gemm_kernel",\n')[1:]
    out = [f"# {title}", "", f"From `{src}` (Nsight Compute source page, SASS); shares of all stall samples of each launch.", ""]
    for name, part in zip(names, parts):
        rows = list(csv.DictReader(io.StringIO(part)))
        total = sum(float(r["Warp Stall Sampling (All Samples)"] or 0) for r in rows)
        reasons = collections.Counter()
        for r in rows:
            for k, v in r.items():
                if k and k.startswith("stall_") and "Not Issued" not in k:
                    reasons[k[6:]] += float(v or 0)
        out += [f"## {name} ({int(total)} samples)", "",
                "by reason: " + ", ".join(f"{k} {v / total:.1%}" for k, v in reasons.most_common(8)), "",
                "| share | SASS |", "|---|---|"]
        for r in sorted(rows, key=lambda r: -float(r["Warp Stall Sampling (All Samples)"] or 0))[:10]:
            out.append(f"| {float(r['Warp Stall Sampling (All Samples)'] or 0) / total:.1%} | `{r['Source'].strip()}` |")
        out.append("")
    with open(out_path, "w") as f:
        f.write("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:]))
