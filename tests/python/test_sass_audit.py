"""scripts/sass-audit.py finds a loop's serial global loads and leaves batched ones alone (a
hand-written cuobjdump -sass listing: no GPU, no CUDA toolkit needed)."""

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("sass_audit", ROOT / "scripts" / "sass-audit.py")
sass_audit = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(sass_audit)

# Kernel `serial`: a loop whose 16-byte load is consumed before the next is issued (the ring CTA's
# dot_heads before session 27), then a load outside any loop. Kernel `batched`: a loop issuing its
# loads two at a time before it uses them, and a predicated MOV that only writes a load's register.
LISTING = """
        Function : serial
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0020*/                   HADD2.F32 R8, -RZ, R6.H0_H0 ;
        /*0030*/                   FFMA R9, R8, R10, R9 ;
        /*0040*/                   IADD3 R2, P0, R2, 0x10, RZ ;
        /*0050*/               @P1 BRA 0x10 ;
        /*0060*/                   LDG.E R11, desc[UR4][R2.64] ;
        /*0070*/                   STG.E desc[UR4][R12.64], R11 ;
        /*0080*/                   EXIT ;
        Function : batched
        /*0000*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0010*/                   LDG.E.128 R12, desc[UR4][R2.64+0x10] ;
        /*0020*/               @P2 MOV R4, RZ ;
        /*0030*/                   FFMA R9, R4, R12, R9 ;
        /*0040*/                   LDG.E R20, desc[UR4][R22.64] ;
        /*0050*/                   LDG.E R21, desc[UR4][R22.64+0x4] ;
        /*0060*/                   FADD R9, R20, R21 ;
        /*0070*/               @P1 BRA 0x0 ;
        /*0080*/                   EXIT ;
"""


def audited():
    return {name: sass_audit.audit(body) for name, body in sass_audit.kernels(LISTING.splitlines())}


def test_a_loops_load_used_before_the_next_is_serial():
    loops, serial = audited()["serial"]
    assert loops == [(0x10, 0x50)]
    assert [(a, b) for a, _, b, _ in serial] == [(0x10, 0x20)]  # the store after the loop is not


def test_loads_issued_together_are_not_serial():
    loops, serial = audited()["batched"]
    assert loops == [(0x0, 0x70)]
    # Each load of a pair is in flight with the other: the first has the second issued before its
    # use, the second goes out while the first is still unused.
    assert serial == []


def test_wide_loads_cover_their_registers():
    assert sass_audit.registers_written("LDG.E.128", "R4") == {"4", "5", "6", "7"}
    assert sass_audit.registers_written("LDG.E.64", "R10") == {"10", "11"}
    assert sass_audit.registers_written("LDG.E", "R3") == {"3"}


def test_the_command_line_prints_one_line_per_kernel(tmp_path, capsys):
    path = tmp_path / "listing.sass"
    path.write_text(LISTING)
    assert sass_audit.main([str(path), "--show"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[0] == "1" and out[0].endswith("serial")
    assert any(line.strip().startswith("-> 00020 HADD2.F32") for line in out)
