"""Where a kernel's warps wait: Nsight Compute's source page (warp stall samples per SASS instruction) in a few
lines per kernel (scripts/gpu_check.sh ncu-mla-source runs it on its reports).

    ncu --import REP --page source --csv --print-source sass > sass.csv
    ncu --import REP --page source --csv --print-source cuda,sass > lines.csv    (optional: source lines)
    python scripts/ncu_source_top.py sass.csv [lines.csv] [--top 25] [--kernel REGEX] [--tag NAME]

Both layouts of the page are read: `sass` ("Kernel Name" row, then a header that starts with "Address", one row per
SASS instruction) and `cuda,sass` ("File Path" / "Function Name" rows, a header that starts with "Line No" and has
"Source" twice, each source line's row (the sum of its instructions, so not counted) followed by its instructions'
rows). Rows of several files are merged by address: the first file that has an instruction's samples gives them,
any file gives its source line.

Printed per kernel ("NCUSRC <tag> ..." lines; offsets are from the kernel's first instruction, as in cuobjdump):
  - the stall samples and their split by reason (the page's `stall_*` columns);
  - the samples per opcode, and per partition (the stretches that begin at a `USETMAXREG`: the warp-specialized
    kernels' partitions set their registers on entry);
  - the mbarrier waits by barrier (`SYNCS.PHASECHK` and the branch that tests its result, the out-of-line retry
    loops included, grouped by the barrier's shared-memory offset);
  - the top instructions by samples with their main reasons and source lines (a wait's retry loop folded into it).
A column it needs and does not find: it says so and prints the header it saw.
"""
import argparse
import csv
import re
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field

SAMPLE_COLUMNS = ("Warp Stall Sampling (All Samples)", "Warp Stall Sampling (All Cycles)", "Sampling Data (All)")
EXECUTED_COLUMN = "Instructions Executed"
# per-reason sample columns: `stall_long_sb` (the page's short names) or the metric names; "(Not Issued)" twins skipped
REASON = re.compile(r"^(?:stall_|smsp__pcsamp_warps_issue_stalled_)([a-z0-9_]+)$")
TRYWAIT = re.compile(r"SYNCS\.PHASECHK")
BRANCH = re.compile(r"^\s*(@!?U?P\w+\s+)?BRA(\.\S+)?\s+(0x[0-9a-fA-F]+)")
BARRIER = re.compile(r"\[([^\]]*)\]")


@dataclass
class Row:
    addr: int
    sass: str
    kernel: str
    file: str = ""
    line: str = ""
    samples: float | None = None  # None: no samples column in its file
    reasons: dict = field(default_factory=dict)
    executed: float | None = None


def number(text):
    """A cell as a number: thousands separators dropped, empty / "-" / "n/a" as 0."""
    s = (text or "").strip()
    for ch in ",'\u00a0\u202f\u2009 ":
        s = s.replace(ch, "")
    try:
        return float(s)
    except ValueError:
        return 0.0


def _columns(header):
    """(samples column index or None, {reason: index}, executed index or None) of a header."""
    sample = next((header.index(c) for c in SAMPLE_COLUMNS if c in header), None)
    if sample is None:  # a renamed column: any "... Sampling (All ...)"
        sample = next((i for i, h in enumerate(header) if "Sampling" in h and "All" in h), None)
    reasons = {m.group(1): i for i, h in enumerate(header) if (m := REASON.match(h.strip()))}
    executed = header.index(EXECUTED_COLUMN) if EXECUTED_COLUMN in header else None
    return sample, reasons, executed


def read(text, problems):
    """The instruction rows of one page's CSV text (either layout), in file order. problems: messages appended."""
    rows, header, kernel, path, line = [], None, "", "", ""
    i_addr = i_sass = i_line = None
    cols = (None, {}, None)
    for cells in csv.reader(text.splitlines()):
        if not cells or not any(c.strip() for c in cells):
            continue
        first = cells[0].strip()
        if first in ("Kernel Name", "Function Name") and len(cells) > 1:
            kernel, header = cells[1].strip(), None
            continue
        if first == "File Path" and len(cells) > 1:
            path, header = cells[1].strip(), None
            continue
        if first in ("Address", "Line No"):
            header = [c.strip() for c in cells]
            src = [i for i, h in enumerate(header) if h == "Source"]
            i_addr = header.index("Address") if "Address" in header else None
            i_line = header.index("Line No") if "Line No" in header else None
            i_sass = src[-1] if src else None  # (cuda,sass: the second "Source" is the SASS text)
            cols = _columns(header)
            if i_addr is None or i_sass is None:
                problems.append(f"no Address / Source column in the header: {header}")
            elif cols[0] is None:
                problems.append(f"no stall-sample column ({' / '.join(SAMPLE_COLUMNS)}) in the header: {header}")
            elif not cols[1]:
                problems.append(f"no per-reason stall columns (stall_*) in the header: {header}")
            continue
        if header is None or i_addr is None or i_sass is None:
            continue

        def cell(i):
            return cells[i].strip() if i is not None and i < len(cells) else ""
        addr = cell(i_addr)
        if i_line is not None and cell(i_line) and cell(i_line) != "-" and (not addr or addr == "-"):
            line = cell(i_line)  # a source line's row: the sum of the instructions that follow it
            continue
        if not addr.lower().startswith("0x"):
            continue  # "...", a folded stretch of the listing
        sample, reasons, executed = cols
        rows.append(Row(int(addr, 16), cell(i_sass), kernel, path if i_line is not None else "",
                        line if i_line is not None else "",
                        number(cell(sample)) if sample is not None else None,
                        {r: number(cell(i)) for r, i in reasons.items()},
                        number(cell(executed)) if executed is not None else None))
    return rows


def merge(files_rows):
    """{kernel: [Row] by address}: the rows of several reads merged by address (samples from the first file that
    has them, the source line from any file)."""
    by_addr = {}
    for rows in files_rows:
        for r in rows:
            have = by_addr.get(r.addr)
            if have is None:
                by_addr[r.addr] = r
                continue
            if have.samples is None and r.samples is not None:
                have.samples, have.reasons, have.executed = r.samples, r.reasons, r.executed
            if not have.line and r.line:
                have.file, have.line = r.file, r.line
    kernels = defaultdict(list)
    for r in sorted(by_addr.values(), key=lambda r: r.addr):
        kernels[r.kernel].append(r)
    return dict(kernels)


def _opcode(sass):
    words = sass.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return ".".join(words[0].split(".")[:2]) if words else "?"


def _regs(sass):
    """The register count a USETMAXREG sets (its last operand)."""
    last = sass.replace(",", " ").split()[-1]
    return str(int(last, 16)) if last.lower().startswith("0x") else last


def _where(r):
    return f"{r.file.rsplit('/', 1)[-1]}:{r.line}" if r.line else ""


def _reasons(reasons, total, n=3):
    top = sorted(((v, k) for k, v in reasons.items() if v > 0), reverse=True)[:n]
    return " ".join(f"{k} {100 * v / total:.0f}%" for v, k in top) if total > 0 else ""


def fold_waits(rows):
    """{index of a row: index of the wait it belongs to}: the conditional branch after a SYNCS.PHASECHK (it tests
    the wait's result), and the out-of-line retry loop that branch jumps to (a SYNCS.PHASECHK, its branch back to
    itself, the branch back to the kernel) when the target resolves (an absolute or a kernel-relative address)."""
    base = rows[0].addr
    at = {r.addr: i for i, r in enumerate(rows)}
    owner = {}
    for i, r in enumerate(rows[:-1]):
        if not TRYWAIT.search(r.sass) or i in owner:
            continue
        nxt = rows[i + 1]
        m = BRANCH.match(nxt.sass)
        if not m or not m.group(1):
            continue
        owner[i + 1] = i
        target = int(m.group(3), 16)
        target = target if target >= base else base + target
        j = at.get(target)
        if target <= nxt.addr or j is None or not TRYWAIT.search(rows[j].sass):
            continue
        for k in range(j, min(j + 4, len(rows))):  # the loop: wait, branch to itself, branch back
            owner[k] = i
            b = BRANCH.match(rows[k].sass)
            if b and not b.group(1):
                break
    return owner


def summarize(kernel, rows, top=25, tag=""):
    """The lines printed for one kernel's rows (sorted by address)."""
    pre = f"NCUSRC {tag + ' ' if tag else ''}"
    sampled = [r for r in rows if r.samples is not None]
    if not sampled:
        return [f"{pre}kernel {kernel}: {len(rows)} SASS rows, none with stall samples"]
    total = sum(r.samples for r in sampled)
    base = rows[0].addr
    reasons = Counter()
    for r in sampled:
        reasons.update(r.reasons)
    lines = [f"{pre}kernel {kernel}: {len(rows)} SASS rows, {total:.0f} stall samples, "
             f"source lines {'yes' if any(r.line for r in rows) else 'no'}"]
    if total <= 0:
        return lines

    def pct(v):
        return f"{100 * v / total:.1f}%"
    reason_total = sum(reasons.values())
    lines.append(f"{pre}reasons (of {reason_total:.0f}): " + ", ".join(
        f"{k} {pct(v)}" for k, v in reasons.most_common() if v >= 0.002 * total))
    ops = Counter()
    for r in sampled:
        ops[_opcode(r.sass)] += r.samples
    lines.append(f"{pre}opcodes: " + ", ".join(f"{k} {pct(v)}" for k, v in ops.most_common(12) if v > 0))

    owner = fold_waits(rows)
    # partitions: a USETMAXREG opens one; a folded retry loop counts where its wait is
    starts = [i for i, r in enumerate(rows) if "USETMAXREG" in r.sass]
    if starts:
        part = Counter()
        for i, r in enumerate(rows):
            k = owner.get(i, i)
            first = max((s for s in starts if s <= k), default=None)
            part[first] += r.samples or 0.0
        lines.append(f"{pre}partitions (from each USETMAXREG, its register count): " + ", ".join(
            f"+0x{rows[s].addr - base:05x} ({_regs(rows[s].sass)}) {pct(v)}" if s is not None else f"before {pct(v)}"
            for s, v in sorted(part.items(), key=lambda kv: (kv[0] is not None, kv[0] or 0))))

    # mbarrier waits, by barrier (the immediate offset in the wait's address operand)
    waits = defaultdict(lambda: [0.0, Counter(), set(), ""])
    for i, r in enumerate(rows):
        k = owner.get(i, i)
        w = rows[k]
        if not TRYWAIT.search(w.sass):
            continue
        operand = BARRIER.search(w.sass)
        key = operand.group(1) if operand else w.sass
        off = re.search(r"0x[0-9a-fA-F]+", key)
        key = off.group(0) if off else key
        g = waits[key]
        g[0] += r.samples or 0.0
        g[1].update(r.reasons)
        g[2].add(k)
        g[3] = g[3] or _where(w)
    if waits:
        lines.append(f"{pre}mbarrier waits by barrier offset ({pct(sum(g[0] for g in waits.values()))} of samples):")
        for key, (v, rs, sites, where) in sorted(waits.items(), key=lambda kv: -kv[1][0])[:12]:
            lines.append(f"{pre}  {key:>10} {pct(v):>6} {len(sites)} sites  {_reasons(rs, v)}  {where}".rstrip())

    # top instructions, a wait's branch and retry loop folded into it
    folded = {}
    for i, r in enumerate(rows):
        k = owner.get(i, i)
        s, rs = folded.get(k, (0.0, Counter()))
        rs = rs.copy()
        rs.update(r.reasons)
        folded[k] = (s + (r.samples or 0.0), rs)
    lines.append(f"{pre}top {top} instructions (offset, share, samples, main reasons, SASS, source line):")
    for k, (v, rs) in sorted(folded.items(), key=lambda kv: -kv[1][0])[:top]:
        if v <= 0:
            break
        r = rows[k]
        lines.append(f"{pre}  +0x{r.addr - base:05x} {pct(v):>6} {v:7.0f}  {_reasons(rs, v):34s} "
                     f"{r.sass[:58]:58s} {_where(r)}".rstrip())
    return lines


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("csv", nargs="+", help="`ncu --import REP --page source --csv --print-source sass` (and cuda,sass)")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--kernel", default="", help="a regular expression: the kernels whose names match it")
    p.add_argument("--tag", default="", help="a word that starts every printed line (after NCUSRC)")
    a = p.parse_args(argv)
    problems, reads = [], []
    for path in a.csv:
        with open(path, newline="") as f:
            text = f.read()
        rows = read(text, problems)
        if not rows:
            problems.append(f"{path}: no instruction rows; its first lines: {text.splitlines()[:3]}")
        reads.append(rows)
    kernels = merge(reads)
    for msg in dict.fromkeys(problems):
        print(f"NCUSRC {a.tag + ' ' if a.tag else ''}note: {msg}"[:2000])
    shown = 0
    order = sorted(kernels.items(), key=lambda kv: -sum(r.samples or 0.0 for r in kv[1]))
    for kernel, rows in order:
        if a.kernel and not re.search(a.kernel, kernel):
            continue
        print("\n".join(summarize(kernel, rows, a.top, a.tag)))
        shown += 1
    return 0 if shown else 1


if __name__ == "__main__":
    sys.exit(main())
