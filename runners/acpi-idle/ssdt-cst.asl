/*
 * ticklab lab analogue for acpi-idle (seed 003): an SSDT giving QEMU's processors a _CST with an I/O-port C2,
 * so that a TCG guest's acpi_idle driver enters C2 through io_idle() -- the inb of P_LVL2, then the dummy wait
 * (a read of the ACPI PM timer) that ticklab's processor.dummy_wait= switch turns on and off.
 *
 * Passed to QEMU with -acpitable file=<compiled .aml> when a lab experiment lists it in lab.acpi_tables; compiled
 * by `ticklab lab run` with iasl (Debian's acpica-tools) into ~/.cache/ticklab/acpi/<sha256 of this file>/.
 *
 * QEMU (7.2, -machine pc) names its processors \_SB.CPUS.C000, C001, ... (hw/acpi/cpu.c, "C%.03X"), so this table
 * covers guests of exactly 4 vCPUs: a Scope naming a processor QEMU did not create would make the table fail to
 * load. Its experiments set lab.smp 4.
 *
 * States: C1 as FFixedHW (Linux falls back to HLT, "ACPI HLT", where the CPU has no MWAIT C-state hint for it) and
 * C2 as SystemIO at port 0x0814, which no QEMU device claims (a read returns 0xff at once: under TCG the entry is
 * an I/O exit, not a sleep). No C3: Linux accepts an I/O-port C3 only with bus-master control (bm_check, which it
 * sets on Intel/Centaur/Zhaoxin CPUs; TCG's -cpu max is AMD) or a PM2 control block (QEMU's FADT has none).
 *
 * The DefinitionBlock's first argument stays empty: Debian 12's iasl (20200925) writes a table with the
 * signature "XXXX" and unresolved names otherwise (measured; /work/shared/notes/acpi-idle-in-tcg-guests.md).
 */
DefinitionBlock ("", "SSDT", 2, "TICKLB", "LABCST", 0x00000001)
{
    External (\_SB.CPUS.C000, DeviceObj)
    External (\_SB.CPUS.C001, DeviceObj)
    External (\_SB.CPUS.C002, DeviceObj)
    External (\_SB.CPUS.C003, DeviceObj)

    /* One package for every CPU: count, then {register, type, latency (us), power (mW)} per state. */
    Name (\_SB.LCST, Package (0x03)
    {
        0x02,
        Package (0x04)
        {
            ResourceTemplate () { Register (FFixedHW, 0x00, 0x00, 0x0000000000000000, ,) },
            0x01,
            0x0001,
            0x03E8
        },
        Package (0x04)
        {
            ResourceTemplate () { Register (SystemIO, 0x08, 0x00, 0x0000000000000814, ,) },
            0x02,
            0x0014,
            0x01F4
        }
    })

    Scope (\_SB.CPUS.C000) { Method (_CST, 0, NotSerialized) { Return (\_SB.LCST) } }
    Scope (\_SB.CPUS.C001) { Method (_CST, 0, NotSerialized) { Return (\_SB.LCST) } }
    Scope (\_SB.CPUS.C002) { Method (_CST, 0, NotSerialized) { Return (\_SB.LCST) } }
    Scope (\_SB.CPUS.C003) { Method (_CST, 0, NotSerialized) { Return (\_SB.LCST) } }
}
