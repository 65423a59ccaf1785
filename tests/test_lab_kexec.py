"""The lab guest can kexec (issue 18, the test bed of boot plans): a TCG guest of our lab kernel (CONFIG_KEXEC) with
Debian's kexec-tools in its initramfs loads its own kernel with one more command-line word and kexecs into it; the
second boot sees the new /proc/cmdline, nohz_full active and a new boot_id, and the 9p share carries state across.
Slow (~20-40 s under TCG); skipped without root, QEMU, a built lab kernel or the image tools."""

import os
import shutil
from pathlib import Path

import pytest

from ticklab.lab import image as guest_image
from ticklab.lab import kernel as lab_kernel
from ticklab.lab import qemu

AFTER_BOOT = """n=$(cat /mnt/share/boots 2>/dev/null || echo 0)
n=$((n + 1))
echo $n > /mnt/share/boots
cat /proc/sys/kernel/random/boot_id > /mnt/share/boot_id.$n
cat /proc/cmdline > /mnt/share/cmdline.$n
cat /sys/devices/system/cpu/nohz_full > /mnt/share/nohz_full.$n
if [ $n -eq 1 ]; then
    kexec -l /mnt/share/bzImage --initrd /mnt/share/initrd --append "$(cat /proc/cmdline) nohz_full=1"
    echo "kexec -l exit $?" > /mnt/share/kexec.log
    sync
    kexec -e
    echo "kexec -e returned $?" >> /mnt/share/kexec.log
fi
"""


def kexec_kernel():
    if os.geteuid() != 0 or qemu.qemu_version() is None or not lab_kernel.SOURCE_TARBALL.is_file():
        pytest.skip("needs root, qemu-system-x86 and linux-source-6.12")
    kernel = lab_kernel.cached_kernel("hz1000")
    if kernel is None:
        pytest.skip("no built hz1000 lab kernel (ticklab lab build-kernel --variant hz1000)")
    if "CONFIG_KEXEC=y" not in (kernel.directory / "config").read_text().splitlines():
        pytest.skip(f"{kernel.directory}/config: built without CONFIG_KEXEC")
    if shutil.which("kexec") is None:
        pytest.skip("kexec-tools is not installed (apt-get install kexec-tools): the guest image takes its kexec")
    return kernel


def test_the_lab_guest_kexecs_itself_into_a_new_command_line(tmp_path):
    kernel = kexec_kernel()
    image = guest_image.build_image(say=lambda _: None)
    share = tmp_path / "share"
    share.mkdir()
    shutil.copy(kernel.image, share / "bzImage")
    shutil.copy(image.initramfs, share / "initrd")
    (share / "after-boot.sh").write_text(AFTER_BOOT)
    boot = qemu.Boot(kernel.image, image.initramfs, share, tmp_path / "console.txt", accel="tcg", smp=2, timeout_s=240)
    outcome = qemu.run_boot(boot)
    console = (tmp_path / "console.txt").read_text(errors="replace")[-2000:]
    assert outcome["status"] == "ok", console
    assert (share / "boots").read_text().strip() == "2", (share / "after-boot.log").read_text() + console
    first, second = ((share / f"boot_id.{n}").read_text().strip() for n in (1, 2))
    assert first and second and first != second
    cmdline1, cmdline2 = ((share / f"cmdline.{n}").read_text().strip() for n in (1, 2))
    assert cmdline1 == boot.full_cmdline()
    assert cmdline2 == cmdline1 + " nohz_full=1"
    assert (share / "nohz_full.1").read_text().strip() == "(null)" or not (share / "nohz_full.1").read_text().strip()
    assert (share / "nohz_full.2").read_text().strip() == "1"
    print(f"two boots, kexec between them, in {outcome['seconds']} s under TCG")
