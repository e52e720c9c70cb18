"""scripts/ncu_source_top.py (gpu_check.sh ncu-mla-source's summary of Nsight Compute's source page) on small CSVs
laid out as `ncu --import REP --page source --csv --print-source sass` and `... cuda,sass` print them: two
partitions, an mbarrier wait whose retry loop sits out of line at the kernel's end, a named barrier, a wgmma."""
import pytest

from scripts import ncu_source_top as nst

HEADER = ('"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)",'
          '"Instructions Executed","stall_barrier","stall_long_sb","stall_wait","stall_barrier (Not Issued)",'
          '"stall_long_sb (Not Issued)","stall_wait (Not Issued)"')


def _row(addr, sass, samples=0, executed=0, barrier=0, long_sb=0, wait=0):
    vals = [samples, samples, executed, barrier, long_sb, wait, barrier, long_sb, wait]
    return ",".join(f'"{v}"' for v in [f"0x{addr:x}", sass, *vals])


BASE = 0x7F3A_0000_0000
TARGET = "{:x}"  # the retry loop's address as the branch prints it: absolute here, kernel-relative below


def _sass_csv(relative=False):
    loop = 0x100 if relative else BASE + 0x100
    back = 0x20 if relative else BASE + 0x20
    return "\n".join([
        '"Kernel Name","mla_split_sm90_shard_kernel"',
        HEADER,
        _row(BASE + 0x00, "USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xf0", executed=132),
        _row(BASE + 0x10, "SYNCS.PHASECHK.TRANS64.TRYWAIT P3, [R8+URZ+0x36610], R15", 100, "1,000", long_sb=90,
             wait=10),
        _row(BASE + 0x20, f"@!P3 BRA 0x{loop:x}", 20, 1000, long_sb=20),
        _row(BASE + 0x30, "BAR.SYNC.DEFER_BLOCKING 0x2, 0x80", 50, 1000, barrier=50),
        _row(BASE + 0x40, "HGMMA.64x32x16.F32.BF16 R152, gdesc[UR48], RZ, !UPT", 30, 1000, wait=30),
        _row(BASE + 0x50, "USETMAXREG.DEALLOC.CTAPOOL 0x18", executed=132),
        _row(BASE + 0x60, "SYNCS.PHASECHK.TRANS64.TRYWAIT P2, [R13+URZ+0x36620], R2", 40, 10, long_sb=40),
        _row(BASE + 0x70, "@!P2 BRA 0x7f3a00000130" if not relative else "@!P2 BRA 0x130", 0, 10),
        _row(BASE + 0x80, "EXIT", 0, 264),
        '"...","...","-","-","-","-","-","-","-","-","-"',
        _row(BASE + 0x100, "SYNCS.PHASECHK.TRANS64.TRYWAIT P3, [R8+URZ+0x36610], R15", 300, 5000, long_sb=300),
        _row(BASE + 0x110, f"@!P3 BRA 0x{loop:x}", 10, 5000, long_sb=10),
        _row(BASE + 0x120, f"BRA 0x{back + 0x10:x}", 0, 1000),
        _row(BASE + 0x130, "SYNCS.PHASECHK.TRANS64.TRYWAIT P2, [R13+URZ+0x36620], R2", 0, 0),
    ]) + "\n"


def _cuda_sass_csv():
    """The cuda,sass layout: a source line's row (its instructions' sum, no address), then its instructions."""
    head = HEADER.replace('"Address","Source"', '"Line No","Source","Address","Source"')
    line = '"{}","{}","",""' + ',"0"' * 9
    return "\n".join([
        '"File Path","/work/src/tileattn/ops/mla/gluon_producer.py"',
        '"Function Name","mla_split_sm90_shard_kernel"',
        head,
        line.format(176, "    mbarrier.wait(f_ready.index(sf), (g // F_STAGES) & 1)"),
        '"",""' + "," + _row(BASE + 0x10, "SYNCS.PHASECHK.TRANS64.TRYWAIT P3, [R8+URZ+0x36610], R15", 100),
        '"",""' + "," + _row(BASE + 0x100, "SYNCS.PHASECHK.TRANS64.TRYWAIT P3, [R8+URZ+0x36610], R15", 300),
        '"File Path","/work/src/tileattn/ops/mla/gluon_sm90_shard.py"',
        '"Function Name","mla_split_sm90_shard_kernel"',
        head,
        line.format(61, "    thread_barrier()"),
        '"",""' + "," + _row(BASE + 0x30, "BAR.SYNC.DEFER_BLOCKING 0x2, 0x80", 50),
    ]) + "\n"


def test_number():
    assert nst.number("1,234") == 1234 and nst.number(" 5\u00a0238 ") == 5238 and nst.number("0.5") == 0.5
    assert nst.number("-") == 0 and nst.number("") == 0 and nst.number("n/a") == 0


@pytest.mark.parametrize("relative", [False, True])
def test_sass_page(relative):
    problems = []
    rows = nst.read(_sass_csv(relative), problems)
    assert not problems
    assert len(rows) == 13 and rows[1].samples == 100 and rows[1].executed == 1000
    assert rows[1].reasons == {"barrier": 0, "long_sb": 90, "wait": 10}  # the "(Not Issued)" twins are not reasons
    kernels = nst.merge([rows])
    lines = nst.summarize("k", kernels["mla_split_sm90_shard_kernel"], top=3, tag="fp8")
    text = "\n".join(lines)
    assert lines[0] == "NCUSRC fp8 kernel k: 13 SASS rows, 550 stall samples, source lines no"
    assert "reasons (of 550): long_sb 83.6%, barrier 9.1%, wait 7.3%" in text
    assert "opcodes: SYNCS.PHASECHK 80.0%, BAR.SYNC 9.1%, BRA 5.5%, HGMMA.64x32x16 5.5%\n" in text
    # the retry loop (0x100-0x120) counts with its wait at 0x10, in the first partition
    assert "partitions (from each USETMAXREG, its register count): +0x00000 (240) 92.7%, +0x00050 (24) 7.3%" in text
    assert "     0x36610  78.2% 1 sites  long_sb 98% wait 2%" in text
    assert "     0x36620   7.3% 1 sites  long_sb 100%\n" in text
    top = [ln for ln in lines if ln.startswith("NCUSRC fp8   +0x")]
    assert len(top) == 3
    assert top[0].startswith("NCUSRC fp8   +0x00010  78.2%     430  long_sb 98% wait 2%")
    assert "SYNCS.PHASECHK.TRANS64.TRYWAIT P3, [R8+URZ+0x36610], R15" in top[0]
    assert top[1].startswith("NCUSRC fp8   +0x00030   9.1%      50  barrier 100%")


def test_source_lines_merged():
    problems = []
    kernels = nst.merge([nst.read(_sass_csv(), problems), nst.read(_cuda_sass_csv(), problems)])
    assert not problems
    rows = kernels["mla_split_sm90_shard_kernel"]
    assert len(rows) == 13  # the cuda,sass rows add no instruction, and their source-line rows are not counted
    by = {r.addr - BASE: r for r in rows}
    assert (by[0x10].line, by[0x30].line, by[0x40].line) == ("176", "61", "")
    assert by[0x10].samples == 100  # from the first file
    text = "\n".join(nst.summarize("mla", rows, top=2))
    assert "source lines yes" in text
    assert "0x36610  78.2% 1 sites  long_sb 98% wait 2%  gluon_producer.py:176" in text
    assert text.splitlines()[-1].endswith("gluon_sm90_shard.py:61")


def test_cuda_sass_page_alone():
    problems = []
    rows = nst.read(_cuda_sass_csv(), problems)
    assert not problems and [(r.addr - BASE, r.line, r.samples) for r in rows] == [
        (0x10, "176", 100), (0x100, "176", 300), (0x30, "61", 50)]


def test_missing_columns_print_the_header(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text('"Kernel Name","k"\n"Address","Source","Instructions Executed"\n"0x10","EXIT","1"\n')
    assert nst.main([str(bad)]) == 0
    out = capsys.readouterr().out
    assert "no stall-sample column" in out and "['Address', 'Source', 'Instructions Executed']" in out
    assert "kernel k: 1 SASS rows, none with stall samples" in out
    empty = tmp_path / "empty.csv"
    empty.write_text("==PROF== nothing\n")
    assert nst.main([str(empty)]) == 1
    assert "no instruction rows" in capsys.readouterr().out


def test_main(tmp_path, capsys):
    a, b = tmp_path / "sass.csv", tmp_path / "lines.csv"
    a.write_text(_sass_csv())
    b.write_text(_cuda_sass_csv())
    assert nst.main([str(a), str(b), "--top", "2", "--tag", "c2", "--kernel", "mla_"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("NCUSRC c2 kernel mla_split_sm90_shard_kernel: 13 SASS rows, 550 stall samples")
    assert sum(ln.startswith("NCUSRC c2   +0x") for ln in out) == 2
    assert nst.main([str(a), "--kernel", "nomatch"]) == 1
