"""How a boot plan boots a run and how it is put back: the systemd unit that resumes the plan after each boot, grub's
one-shot menu entry (custom.cfg and ``grub-reboot``), kexec, and the run's kernel files. What differs between the
modes is each mode's :class:`BootMode` object (:class:`Kexec`, :class:`Grub`, :class:`Manual`, in ``BOOT_MODES``).

Boot verification and the order of the steps are :mod:`ticklab.host.plan_engine`'s; what is installed is journalled
through :class:`~ticklab.host.HostChanges` (``keep``), and :func:`put_back_what_is_there` removes what this plan
installed that its journal no longer lists.

An abort first cancels the unit's start job queued at this boot (``systemctl --no-block stop``) and resets a failed
state (:func:`stop_unit`), so removing the unit leaves systemd no job to fail and no failed unit.
"""

from __future__ import annotations

import abc
import os
import re
import shlex
import sys
from pathlib import Path

from ..registry import BOOT_MODES as BOOT_MODE_NAMES
from ..safefiles import shown
from . import facts
from .change_kinds import read_plan_file, run_command, write_plan_file
from .journal import HostChangeError
from .knobs import HostChanges
from .plan_state import BootRun, Plan, PlanError, boot_facts, boot_words, one_line

UNIT_NAME = "ticklab-plan.service"
UNIT_PATH = f"etc/systemd/system/{UNIT_NAME}"
UNIT_LINK = f"etc/systemd/system/multi-user.target.wants/{UNIT_NAME}"
GRUB_CUSTOM = "boot/grub/custom.cfg"
_GRUB_WORD = re.compile(r"[A-Za-z0-9_.,:=/+@%-]+")  # what grub's script parser reads as one plain word


def kexec_takes_over_reboots(root: Path | str) -> str | None:
    """The file that makes Debian's kexec-tools kexec at every reboot (``LOAD_KEXEC=true`` in /etc/default/kexec or a
    snippet of /etc/default/kexec.d, as its init script reads them: the last assignment wins), or None."""
    root = Path(root)
    files = [root / "etc/default/kexec"] + sorted((root / "etc/default/kexec.d").glob("*"))
    found = None
    for path in files:
        text = facts.read_text(path) or ""
        for line in text.splitlines():
            words = line.split("#", 1)[0].strip()
            if words.startswith("LOAD_KEXEC="):
                value = words[len("LOAD_KEXEC=") :].strip().strip("\"'")
                found = path if value == "true" else None
    return str(found) if found else None


def kernel_files(root: Path, plan: Plan, run: BootRun, *, planned: bool = False) -> tuple[Path, Path | None]:
    """The run's kernel image and initrd; ``planned``: the plan was made with them (checked then), so a missing image
    was moved or removed since."""
    if "/" in run.kernel:
        image, initrd = Path(run.kernel), Path(run.initrd) if run.initrd else None
    else:
        release = plan.original["release"] if run.kernel == "running" else run.kernel
        image = root / "boot" / f"vmlinuz-{release}"
        initrd = root / "boot" / f"initrd.img-{release}"
        initrd = initrd if initrd.is_file() else None
    if not image.is_file() and planned:
        raise PlanError(
            f"{image}: missing, the kernel of run {run.name} ({run.condition}); it was there when the plan "
            "was made, so it was moved or removed since"
        )
    if not image.is_file():
        raise PlanError(
            f"{image}: missing, the kernel of run {run.name} ({run.condition}); "
            "build and install it first (ticklab kernel build --host)"
        )
    return image, initrd


def _named_project() -> list[str]:
    """``--project DIR`` when the plan's project was named (--project or $TICKLAB_PROJECT): the unit starts with
    systemd's environment, where neither is, and a wheel installed elsewhere would find no project at boot."""
    from ..paths import ProjectError, find_project

    try:
        directory, named_by = find_project()
    except ProjectError:
        return []
    return ["--project", str(directory)] if named_by in ("--project", "TICKLAB_PROJECT") else []


def unit_text(root: Path, plan_id: str) -> str:
    argv = [sys.executable, "-m", "ticklab.cli", *_named_project(), "plan", "resume", "--id", plan_id]
    if str(root) != "/":
        argv += ["--root", str(root)]
    # DefaultDependencies=no: multi-user.target would otherwise order itself after the units it wants,
    # a cycle with After=multi-user.target
    return (
        "[Unit]\n"
        f"Description=ticklab boot plan {plan_id}: verify this boot, make the next run\n"
        "DefaultDependencies=no\n"
        "Requires=sysinit.target\n"
        "After=basic.target multi-user.target network-online.target\n"
        "Conflicts=shutdown.target\nBefore=shutdown.target\n\n"
        "[Service]\nType=oneshot\n"
        f"ExecStart={shlex.join(argv)}\n"
        "StandardOutput=journal+console\nStandardError=journal+console\n"
        # the run's lines reach the journal before systemd stops this unit for the reboot it queued
        "Environment=PYTHONUNBUFFERED=1\n"
        "TimeoutStartSec=infinity\n\n"
        "[Install]\nWantedBy=multi-user.target\n"
    )


def systemd_running(root: Path) -> bool:
    return (root / "run/systemd/system").is_dir()


def run_tool(argv: list[str]) -> None:
    """A command that changes nothing ticklab journals (daemon-reload, the reboot itself), as knobs runs its own."""
    try:
        run_command(argv)
    except HostChangeError as exc:
        raise PlanError(str(exc)) from None


def install_unit(host: HostChanges, root: Path, plan: Plan) -> None:
    if any(c.kind == "file" and c.path == str(root / UNIT_PATH) for c in host.changes):
        return
    if os.path.lexists(root / UNIT_PATH):
        raise PlanError(
            f"{root / UNIT_PATH}: exists already (another plan's, or left by hand); "
            "'ticklab plan abort' for its plan, or remove it"
        )
    host.write_file(UNIT_PATH, unit_text(root, plan.id), label="boot plan resume unit")
    host.symlink(UNIT_LINK, f"../{UNIT_NAME}", label="boot plan resume unit enabled")
    if systemd_running(root):
        run_tool(["systemctl", "daemon-reload"])


def check_grub_words(root: Path, run_name: str, cmdline: str) -> None:
    """PlanError where ``cmdline`` cannot go into a grub menu entry as it is (``grub_entry`` and ``capture --boot
    grub --dry-run`` check it alike, so a dry run refuses what the real plan refuses)."""
    # whatever made the command line: a newline (or any control character) would end the linux line and start
    # another (an initrd or linux of its own); grub's script parser would read quotes, $, ; and braces
    control = next((c for c in cmdline if not c.isprintable()), None)
    if control is not None:
        raise PlanError(
            f"{root / GRUB_CUSTOM}: the command line of run {run_name} holds the control character "
            f"{control!r}; it cannot go into a grub menu entry (nor any command line)"
        )
    unsafe = [w for w in cmdline.split(" ") if w and not _GRUB_WORD.fullmatch(w)]
    if unsafe:
        raise PlanError(
            f"{root / GRUB_CUSTOM}: command-line word '{shown(unsafe[0])}' of run {run_name} cannot go "
            "into a grub menu entry as it is; use --boot kexec or manual"
        )


def grub_entry(root: Path, plan: Plan, run: BootRun, image: Path, initrd: Path | None) -> tuple[str, str]:
    """A menu entry in /boot/grub/custom.cfg (Debian's grub.cfg sources it via 41_custom; grub.cfg is not
    regenerated and its default is untouched) for this run's kernel and command line."""
    check_grub_words(root, run.name, run.cmdline)
    separate_boot = str(root / "boot") in facts.mounts(root)

    def on_disk(path: Path) -> str:
        try:
            text = "/" + str(path.relative_to(root))
        except ValueError:
            raise PlanError(
                f"{root / GRUB_CUSTOM}: the kernel file {shown(path)} of run {run.name} is not under "
                f"{root}; grub boots files of this root only"
            ) from None
        text = text[len("/boot") :] if separate_boot and text.startswith("/boot/") else text
        if not _GRUB_WORD.fullmatch(text):
            raise PlanError(
                f"{root / GRUB_CUSTOM}: the kernel file '{shown(text)}' of run {run.name} cannot go into a "
                "grub menu entry as it is; use --boot kexec or manual"
            )
        return text

    title = f"ticklab-plan-{plan.id}"
    lines = [
        f"menuentry '{title}' --id '{title}' {{",
        f"  search --no-floppy --file --set=root {on_disk(image)}",
        f"  linux {on_disk(image)} {run.cmdline}",
    ]
    if initrd:
        lines.append(f"  initrd {on_disk(initrd)}")
    return "\n".join(lines + ["}"]) + "\n", title


def grub_menu_entries(plan: Plan, root: Path | str = "/") -> list[str]:
    """The custom.cfg menu entry each run of ``plan`` would boot with in grub mode (what :func:`create` checks before
    the first boot); PlanError for a run no entry can be written for."""
    root = Path(root)
    return [grub_entry(root, plan, run, *kernel_files(root, plan, run))[0] for run in plan.runs]


def is_plan_unit(text: str, plan_id: str | None = None) -> bool:
    """Whether ``text`` is a unit :func:`unit_text` wrote (for ``plan_id``, or for any plan when None)."""
    lines = text.splitlines()
    described = [
        line[len("Description=ticklab boot plan ") :].split(":", 1)[0]
        for line in lines
        if line.startswith("Description=ticklab boot plan ")
    ]
    started = []
    for line in lines:
        if line.startswith("ExecStart="):
            try:
                argv = shlex.split(line[len("ExecStart=") :])
            except ValueError:
                return False
            if "--project" in argv[:-1]:  # the unit names the plan's project (_named_project)
                at = argv.index("--project")
                argv = argv[:at] + argv[at + 2 :]
            marker = ["-m", "ticklab.cli", "plan", "resume", "--id"]
            at = next((i for i in range(len(argv)) if argv[i : i + len(marker)] == marker), None)
            if at is not None and at + len(marker) < len(argv):
                started.append(argv[at + len(marker)])
    if len(described) != 1 or started != described:
        return False
    return plan_id is None or described[0] == plan_id


def put_back_what_is_there(root: Path, plan: Plan, say) -> list[str]:
    """Remove what this plan installed and the journal no longer lists: its unit (recognised by its content) and the
    link enabling it, its grub menu entry and one-shot next_entry, a kexec kernel loaded for it. Returns what could
    not be put back, one phrase each; what belongs to someone else (another plan's unit) is left as it is."""
    problems, done = [], []
    unit, link = root / UNIT_PATH, root / UNIT_LINK
    ours_gone = True
    if os.path.lexists(unit):
        try:
            text = read_plan_file(unit) or ""
        except HostChangeError as exc:
            text = None
            problems.append(f"{one_line(exc)}; not ticklab's unit of plan {plan.id}, left as it is")
        if text is not None and is_plan_unit(text, plan.id):
            try:
                unit.unlink()
                done.append(f"removed {unit}")
            except OSError as exc:
                problems.append(f"{unit}: cannot remove ({exc.strerror or exc})")
                ours_gone = False
        elif text is not None:  # another plan's or someone else's unit (and its link): not this plan's to remove
            say(f"boot plan {plan.id}: {unit}: not ticklab's unit of plan {plan.id}; left as it is, with its link")
            ours_gone = False
    if ours_gone and os.path.lexists(link):
        if os.path.islink(link) and os.readlink(link) == f"../{UNIT_NAME}":
            try:
                link.unlink()
                done.append(f"removed {link}")
            except OSError as exc:
                problems.append(f"{link}: cannot remove ({exc.strerror or exc})")
        else:
            problems.append(f"{link}: not the link ticklab makes (-> ../{UNIT_NAME}); left as it is")
    title = f"ticklab-plan-{plan.id}"
    custom = root / GRUB_CUSTOM
    try:
        text = read_plan_file(custom)
        opening = f"menuentry '{title}' --id '{title}' {{\n"
        if text is not None and opening in text:
            start = text.index(opening)
            end = text.find("\n}\n", start)
            end = len(text) if end < 0 else end + 3
            rest = text[:start] + text[end:]
            if rest.strip():
                write_plan_file(custom, rest)
            else:
                custom.unlink()
            done.append(f"removed the menu entry {title} from {custom}")
    except (HostChangeError, OSError) as exc:
        problems.append(f"{one_line(exc)} (the menu entry {title} may be left in it)")
    grubenv = root / "boot/grub/grubenv"
    try:
        env = read_plan_file(grubenv)
        if env is not None and f"next_entry={title}" in env.splitlines():
            run_command(["grub-editenv", str(grubenv), "unset", "next_entry"])
            done.append(f"unset next_entry={title} in {grubenv}")
    except HostChangeError as exc:
        problems.append(f"{one_line(exc)} (next_entry={title} may be left in it)")
    mode_done, mode_problems = boot_mode(plan.mode).put_back(root)
    done += mode_done
    problems += mode_problems
    if done:
        say(f"boot plan {plan.id}: not in its journal, put back: {'; '.join(done)}")
    return problems


def return_to_original(root: Path, plan: Plan) -> str:
    here = boot_facts(root)
    same = here["release"] == plan.original["release"] and boot_words(here["cmdline"]) == boot_words(
        plan.original["cmdline"]
    )
    if same:
        return "finished; this boot is already the original kernel and command line"
    return boot_mode(plan.mode).return_to_original(root, plan)


class BootMode(abc.ABC):
    """What differs between the ways a boot plan reaches a run's kernel (``capture --boot``, a plan's ``mode``): one
    object per name of ``registry.BOOT_MODES``, registered by :func:`boot_mode_named`; the engine
    (:mod:`ticklab.host.plan_engine`) asks the plan's object, never its name."""

    name: str

    def check_run(self, root: Path, run_name: str, cmdline: str) -> None:
        """PlanError where this mode cannot boot a run with ``cmdline`` (what ``capture --boot --dry-run`` checks of
        each run, as the plan would)."""
        return None

    def check_plan(self, root: Path, plan: Plan) -> None:
        """PlanError for what this mode cannot boot, before the plan is made (its kernels exist by then)."""
        return None

    def load(self, host: HostChanges, root: Path, plan: Plan, run: BootRun, image: Path, initrd: Path | None) -> None:
        """Make the machine's next boot the run's, every change through ``host`` (its journal puts it back)."""
        return None

    @abc.abstractmethod
    def boot(self, root: Path, run: BootRun, image: Path, initrd: Path | None, say) -> str:
        """Start the run's boot (on a real host kexec and reboot do not return), or say how to; what was done."""

    def put_back(self, root: Path) -> tuple[list[str], list[str]]:
        """What this mode left that no journal lists, put back: (what was done, what could not be), one phrase each."""
        return [], []

    @abc.abstractmethod
    def return_to_original(self, root: Path, plan: Plan) -> str:
        """The plan is finished and this boot is not the original kernel and command line: go back (or say how)."""


BOOT_MODES: dict[str, BootMode] = {}  # registry.BOOT_MODES' names -> their objects (checked below the classes)


def boot_mode_named(cls: type[BootMode]) -> type[BootMode]:
    """Register a boot mode's class: its one object is what a plan of its ``name`` boots with."""
    BOOT_MODES[cls.name] = cls()
    return cls


def boot_mode(name: str) -> BootMode:
    """The boot mode ``--boot name`` (a plan's ``mode``) is; PlanError naming the choices for one there is none of."""
    try:
        return BOOT_MODES[name]
    except KeyError:
        raise PlanError(f"--boot {name}: one of {', '.join(BOOT_MODES)}") from None


def _reboot(root: Path, run: BootRun, image: Path, how: str, argv: list[str], say) -> str:
    # --no-block: the unit running this waits for nothing; systemd stops it and goes on to kexec/reboot
    say(f"run {run.name} ({run.condition}): {how} into {image} with '{run.cmdline}'")
    run_tool(argv)
    return " ".join(argv)


def _kexec_now(root: Path) -> list[str]:
    return ["systemctl", "--no-block", "kexec"] if systemd_running(root) else ["kexec", "-e"]


@boot_mode_named
class Kexec(BootMode):
    """``kexec -l`` the run's kernel and command line, then ``systemctl kexec`` (``kexec -e`` without systemd); at the
    end, kexec back into the original kernel and command line."""

    name = "kexec"

    def load(self, host: HostChanges, root: Path, plan: Plan, run: BootRun, image: Path, initrd: Path | None) -> None:
        host.kexec_load(str(image), str(initrd) if initrd else None, run.cmdline)

    def boot(self, root: Path, run: BootRun, image: Path, initrd: Path | None, say) -> str:
        return _reboot(root, run, image, "kexec", _kexec_now(root), say)

    def put_back(self, root: Path) -> tuple[list[str], list[str]]:
        if (facts.read_text(root / "sys/kernel/kexec_loaded") or "").strip() != "1":
            return [], []
        try:
            run_command(["kexec", "-u"])
        except HostChangeError as exc:
            return [], [f"a kexec kernel is still loaded: {one_line(exc)}"]
        return ["unloaded the kexec kernel"], []

    def return_to_original(self, root: Path, plan: Plan) -> str:
        image = root / "boot" / f"vmlinuz-{plan.original['release']}"
        initrd = root / "boot" / f"initrd.img-{plan.original['release']}"
        if not image.is_file():
            return f"finished; {image} missing: reboot to return to the default kernel"
        argv = (
            ["kexec", "-l", str(image)]
            + (["--initrd", str(initrd)] if initrd.is_file() else [])
            + ["--append", " ".join(boot_words(plan.original["cmdline"]))]
        )
        run_tool(argv)
        run_tool(_kexec_now(root))
        return f"finished; kexec back into {plan.original['release']} with the original command line"


@boot_mode_named
class Grub(BootMode):
    """A one-shot menu entry in custom.cfg (``grub-reboot``), then ``systemctl reboot``; at the end, a reboot into the
    default entry (never changed)."""

    name = "grub"

    def check_run(self, root: Path, run_name: str, cmdline: str) -> None:
        check_grub_words(root, run_name, cmdline)

    def check_plan(self, root: Path, plan: Plan) -> None:
        grub_menu_entries(plan, root)  # every menu entry one grub can take as it is
        takes_over = kexec_takes_over_reboots(root)
        if takes_over:
            raise PlanError(
                f"{takes_over}: kexec-tools turns every reboot into a kexec of the default kernel with this "
                "boot's command line, so no reboot would reach grub's one-shot entry; set LOAD_KEXEC=false "
                "(dpkg-reconfigure kexec-tools) or use --boot kexec"
            )

    def load(self, host: HostChanges, root: Path, plan: Plan, run: BootRun, image: Path, initrd: Path | None) -> None:
        grub_cfg = read_plan_file(root / "boot/grub/grub.cfg") or ""
        if "custom.cfg" not in grub_cfg:
            raise PlanError(
                f"{root / 'boot/grub/grub.cfg'}: does not source custom.cfg (Debian's /etc/grub.d/41_custom); "
                "--boot grub needs it, or use --boot kexec|manual"
            )
        user_custom = read_plan_file(root / GRUB_CUSTOM) or ""
        entry, title = grub_entry(root, plan, run, image, initrd)
        host.write_file(
            GRUB_CUSTOM,
            user_custom + ("\n" if user_custom and not user_custom.endswith("\n") else "") + entry,
            label="boot plan grub entry",
        )
        host.grub_reboot(title)

    def boot(self, root: Path, run: BootRun, image: Path, initrd: Path | None, say) -> str:
        return _reboot(root, run, image, "reboot", ["systemctl", "--no-block", "reboot"], say)

    def return_to_original(self, root: Path, plan: Plan) -> str:
        run_tool(["systemctl", "--no-block", "reboot"])
        return "finished; rebooting into the default entry (never changed)"


@boot_mode_named
class Manual(BootMode):
    """Nothing loaded: the run's kernel and command line are printed for someone to boot by hand."""

    name = "manual"

    def boot(self, root: Path, run: BootRun, image: Path, initrd: Path | None, say) -> str:
        text = (
            f"boot run {run.name} ({run.condition}): kernel {image}"
            + (f", initrd {initrd}" if initrd else "")
            + f", command line: {run.cmdline}\n"
            "then ticklab-plan.service resumes the plan (or run 'ticklab plan resume'); the default entry is unchanged"
        )
        say(text)
        return text

    def return_to_original(self, root: Path, plan: Plan) -> str:
        return (
            f"finished; boot the default entry again (kernel {plan.original['release']}, "
            f"command line '{plan.original['cmdline']}')"
        )


if tuple(BOOT_MODES) != BOOT_MODE_NAMES:
    raise ImportError(f"host/boot_loaders.py: boot modes {list(BOOT_MODES)}; registry.py: {list(BOOT_MODE_NAMES)}")


def stop_unit(root: Path, plan: Plan, say) -> None:
    """Before an abort removes this plan's unit: its start job, queued at this boot (the unit starts after
    multi-user.target), is cancelled by queueing a stop (``--no-block``: the cancel is done when the stop job is
    queued, and nothing waits on the unit's ordering), and a failed state from an earlier resume of this boot is
    reset. Otherwise systemd fails the queued job once the unit file is gone and reloaded ("Failed to start
    ticklab-plan.service") and lists the unit failed. Never from the unit itself: only an abort, which the unit does
    not run (a resume that ends its plan removes the unit it runs in)."""
    if not systemd_running(root) or not os.path.lexists(root / UNIT_PATH):
        return
    try:
        text = read_plan_file(root / UNIT_PATH) or ""
    except HostChangeError:
        return  # not a file ticklab wrote: the abort says so when putting things back
    if not is_plan_unit(text, plan.id):
        return
    for argv in (["systemctl", "--no-block", "stop", UNIT_NAME], ["systemctl", "reset-failed", UNIT_NAME]):
        try:
            run_command(argv)
        except HostChangeError as exc:  # the unit is removed all the same; systemd may list it failed
            say(f"boot plan {plan.id}: {one_line(exc)}; systemd may report {UNIT_NAME} failed")
