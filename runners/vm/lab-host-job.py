#!/usr/bin/python3
"""The lab host's job driver (ticklab.lab.labhost): runs at every boot of the lab host, twice, as two systemd units
around the boot plan's own ``ticklab-plan.service``, and plays the user at the keyboard. Standard library only.

``before`` (ordered before the plan's unit): a user acting between boots — ``ticklab plan abort`` once the plan has
made ``abort_when_made`` runs; the next run's kernel image moved away once it has made ``hide_kernel_when_made``.

``after`` (ordered after it): on the first boot, starts the job's command (``ticklab capture <claim> --boot ...``),
which reboots into the plan's first run; on later boots, nothing while the plan runs (its unit has queued the next
reboot), and once the plan has ended: the hidden kernel image put back, then a reboot as a user would make — through
the firmware and grub's default entry — whose boot is the check: what the machine came up with, written to
``final.json``, then power off.

A job the host resumed (``ticklab lab host-plan --resume``: QEMU was stopped, and the same disk booted again;
``resumes`` in the job counts them): at the first boot after each resume, ``before`` looks at the plan's run. A run
that was booting when QEMU stopped did not come up (the kexec load is gone with the machine's memory; grub may have
spent its one-shot): this boot is the firmware's default, which the plan's resume would take for a boot gone wrong
and end the plan. The driver does what the user who cut the power does: boots the run's kernel and command line
again as the plan set them (kexec: the run's image, initrd and command line loaded and kexec'd; grub: the plan's
entry, still in custom.cfg, as the one-shot) before the plan's unit starts, and the plan's resume verifies that
boot as any other. A run that was being made is left to the plan (it records it failed, cut short, and goes on).

A ``record_only`` job does nothing but the first boot's records and powers off. The first boot's /proc/modules is
kept as ``proc-modules.txt`` (the modules a kernel built for this system keeps: ``kernel build --host --modules``).

Every boot appends a line to ``boots.jsonl`` (the boot's id, kernel, command line, uptime, the plan's state), and
every line said goes to the console, which the host side timestamps.
"""

import glob
import json
import os
import subprocess
import sys
import time

STATE = "/var/lib/ticklab-lab"
JOB = "/etc/ticklab-lab/job.json"
PLANS = "/var/lib/ticklab/plans"
SHUTDOWN_TARGETS = ("reboot.target", "kexec.target", "poweroff.target", "halt.target")


def say(text):
    print(f"ticklab-lab-job: {text}", flush=True)


def read(path, default=""):
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return default


def load_json(path, default):
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return default


def save_json(path, data):
    with open(path + ".tmp", "w") as handle:
        json.dump(data, handle, indent=2, sort_keys=True)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(path + ".tmp", path)


def boot_words(cmdline):
    return [w for w in cmdline.split() if not w.startswith(("BOOT_IMAGE=", "initrd="))]


def the_plan():
    found = sorted(glob.glob(f"{PLANS}/*/plan.json"))
    return load_json(found[-1], None) if found else None


def run(argv, cwd=None):
    result = subprocess.run(argv, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
    with open(f"{STATE}/commands.log", "a") as log:
        log.write(f"$ {' '.join(argv)}\nexit {result.returncode}\n{result.stdout}{result.stderr}\n")
    for line in (result.stdout + result.stderr).splitlines():
        say(f"| {line}")
    return result.returncode


def shutdown_queued():
    jobs = subprocess.run(["systemctl", "list-jobs", "--no-legend", "--plain"], capture_output=True, text=True,
                          check=False).stdout
    return any(word in SHUTDOWN_TARGETS for line in jobs.splitlines() for word in line.split()[:2])


def main(phase):
    os.makedirs(STATE, exist_ok=True)
    job = load_json(JOB, None)
    if job is None:
        say(f"{JOB}: no job; nothing to do")
        return 0
    state = load_json(f"{STATE}/state.json", {"boots": 0})
    plan = the_plan()
    cmdline, release = read("/proc/cmdline"), read("/proc/sys/kernel/osrelease")
    made = sum(r["state"] == "made" for r in plan["runs"]) if plan else 0
    if phase == "before":
        state["boots"] += 1
    line = {"phase": phase, "boot": state["boots"], "boot_id": read("/proc/sys/kernel/random/boot_id"),
            "release": release, "cmdline": cmdline, "uptime_s": float(read("/proc/uptime", "0 0").split()[0]),
            "clock": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "plan": plan["state"] if plan else None, "made": made}
    with open(f"{STATE}/boots.jsonl", "a") as log:
        log.write(json.dumps(line) + "\n")
        log.flush()
        os.fsync(log.fileno())  # a kernel that panics soon after leaves the line, not a zero-filled block
    say(f"{phase} boot {state['boots']} ({release}, up {line['uptime_s']:.1f} s): '{cmdline}'; "
        f"plan {line['plan']}, {made} made")
    save_json(f"{STATE}/state.json", state)
    if phase == "before" and not os.path.exists(f"{STATE}/proc-modules.txt"):
        # what a kernel built for this system keeps with localmodconfig (kernel build --host --modules)
        with open(f"{STATE}/proc-modules.txt", "w") as handle:
            handle.write(read("/proc/modules") + "\n")
    if job.get("record_only"):
        if phase == "after":
            say("recorded this boot (proc-modules.txt): powering off")
            subprocess.run(["sync"], check=False)
            subprocess.run(["systemctl", "--no-block", "poweroff"], check=False)
        return 0
    if state["boots"] > int(job.get("max_boots", 60)):
        say(f"more than {job.get('max_boots', 60)} boots: giving up")
        state["done"] = "gave up"
        save_json(f"{STATE}/state.json", state)
        subprocess.run(["systemctl", "poweroff"], check=False)
        return 1
    if phase == "before":
        return before(job, state, plan, made, release, cmdline)
    return after(job, state, plan, cmdline, release)


def resumed_boot(job, state, plan, release, cmdline):
    """The commands that boot again the run a stopped QEMU cut off mid-boot, at the first boot after a resume ([]
    otherwise); ``state`` records that this resume was looked at."""
    if int(job.get("resumes", 0)) <= int(state.get("resumes_seen", 0)):
        return []
    state["resumes_seen"] = int(job["resumes"])
    if not plan or plan["state"] != "running" or state.get("done"):
        return []
    run = next((r for r in plan["runs"] if r["state"] == "booting"), None)
    if run is None:
        return []
    wanted = plan["original"]["release"] if run["kernel"] == "running" else run.get("release") or run["kernel"]
    if release == wanted and boot_words(cmdline) == boot_words(run["cmdline"]):
        return []  # the run's own boot came up (grub's one-shot was still set)
    if plan["mode"] == "kexec":
        if "/" in run["kernel"]:
            image, initrd = run["kernel"], run.get("initrd")
        else:
            image, initrd = f"/boot/vmlinuz-{wanted}", f"/boot/initrd.img-{wanted}"
            initrd = initrd if os.path.isfile(initrd) else None
        load = ["kexec", "-l", image] + (["--initrd", initrd] if initrd else []) + ["--append", run["cmdline"]]
        return [load, ["systemctl", "--no-block", "kexec"]]
    if plan["mode"] == "grub":
        return [["grub-reboot", f"ticklab-plan-{plan['id']}"], ["systemctl", "--no-block", "reboot"]]
    return []


def boot_again(commands, plan, limit_s=600):
    """Run the commands that boot the cut-off run again, then hold this unit (ordered before the plan's) until the
    reboot takes the machine down, so the plan's resume never sees this boot."""
    cut = next(r for r in plan["runs"] if r["state"] == "booting")
    say(f"resumed by the host: run {cut['name']} ({cut['condition']}) was booting when QEMU stopped; booting it again")
    for argv in commands:
        if run(argv) != 0:
            say(f"{' '.join(argv)} failed: the plan's resume will judge this boot")
            return 0
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        time.sleep(2)
    say(f"no reboot after {limit_s} s: the plan's resume will judge this boot")
    return 0


def before(job, state, plan, made, release="", cmdline=""):
    again = resumed_boot(job, state, plan, release, cmdline)
    save_json(f"{STATE}/state.json", state)
    if again:
        return boot_again(again, plan)
    if not plan or plan["state"] != "running" or state.get("done"):
        return 0
    if job.get("abort_when_made") is not None and made >= job["abort_when_made"] and not state.get("aborted"):
        say(f"{made} run(s) made: ticklab plan abort, as a user would")
        state["aborted"] = run([job["ticklab"], "plan", "abort"], cwd=job["cwd"])
        save_json(f"{STATE}/state.json", state)
    if job.get("hide_kernel_when_made") is not None and made >= job["hide_kernel_when_made"] and not state.get("hidden"):
        nxt = next((r for r in plan["runs"] if r["state"] == "planned"), None)
        release = nxt and (nxt.get("release") or nxt["kernel"])
        image = f"/boot/vmlinuz-{release}"
        if nxt and os.path.isfile(image):
            hidden = f"/boot/ticklab-lab-hidden-vmlinuz-{release}"
            os.rename(image, hidden)
            state["hidden"] = [image, hidden]
            save_json(f"{STATE}/state.json", state)
            say(f"{made} run(s) made: {image} moved away before run {nxt['name']} boots")
    return 0


def after(job, state, plan, cmdline, release):
    if state.get("done"):
        return check(job, state, cmdline, release)
    cut_off = plan is None and state.get("started") and "start_exit" not in state and int(job.get("resumes", 0))
    if cut_off:
        say("resumed by the host: the command was stopped before it made its plan; starting it again")
    if not state.get("started") or cut_off:
        state["started"] = True
        save_json(f"{STATE}/state.json", state)
        say("starting: " + " ".join(job["argv"]))
        code = run(job["argv"], cwd=job["cwd"])
        state["start_exit"] = code
        save_json(f"{STATE}/state.json", state)
        if code != 0 and not shutdown_queued():
            say(f"the command failed (exit {code}) and no reboot is queued: checking this boot")
            return finish(state, "the command failed")
        return 0
    if shutdown_queued():
        return 0
    resuming = wait_for_resume()
    if resuming:
        say(f"waited {resuming:.0f} s for the plan's resume to exit (its unit's start job had ended before it)")
        if shutdown_queued():
            return 0
        plan = the_plan()
    if plan and plan["state"] == "running":
        say("plan running and no reboot queued: 'ticklab plan resume' did not boot the next run; checking")
        return finish(state, "plan running, no reboot queued")
    if state.get("hidden"):
        image, hidden = state["hidden"]
        os.rename(hidden, image)
        say(f"{image} put back")
    return finish(state, f"plan {plan['state'] if plan else 'missing'}")


def resume_running():
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    argv = handle.read().split(b"\0")
            except OSError:
                continue
            if b"ticklab.cli" in argv and b"resume" in argv:
                return True
    return False


def wait_for_resume(limit_s=3600):
    """A plan that removes its own unit at its end leaves systemd's start job failed while the resume still runs
    (seen on the lab host): this unit's ordering after it does not wait for the process, so this does."""
    started = time.monotonic()
    while resume_running() and time.monotonic() - started < limit_s:
        time.sleep(2)
    return time.monotonic() - started if time.monotonic() - started >= 2 else 0


def finish(state, why):
    state["done"] = why
    save_json(f"{STATE}/state.json", state)
    say(f"done ({why}): rebooting through the firmware and grub's default entry to check the machine")
    subprocess.run(["sync"], check=False)
    subprocess.run(["systemctl", "--no-block", "reboot"], check=False)
    return 0


def check(job, state, cmdline, release):
    """The boot after the plan: what a user would find."""
    status = subprocess.run([job["ticklab"], "plan", "status"], cwd=job["cwd"], capture_output=True, text=True,
                            check=False)
    grubenv = read("/boot/grub/grubenv")
    final = {"cmdline": cmdline, "release": release, "boot_words": boot_words(cmdline),
             "plan_status": (status.stdout + status.stderr).strip(), "plan_status_exit": status.returncode,
             "plan_unit": os.path.lexists("/etc/systemd/system/ticklab-plan.service"),
             "plan_unit_link": os.path.lexists("/etc/systemd/system/multi-user.target.wants/ticklab-plan.service"),
             "kexec_loaded": read("/sys/kernel/kexec_loaded"), "grubenv_next_entry":
                 [line for line in grubenv.splitlines() if line.startswith("next_entry=")],
             "custom_cfg": os.path.exists("/boot/grub/custom.cfg"),
             "custom_cfg_text": read("/boot/grub/custom.cfg"),
             "kernels": sorted(os.listdir("/boot")), "done": state.get("done")}
    save_json(f"{STATE}/final.json", final)
    say("check: " + json.dumps({k: final[k] for k in ("release", "plan_unit", "kexec_loaded", "custom_cfg")}))
    for line in final["plan_status"].splitlines():
        say(f"status| {line}")
    subprocess.run(["sync"], check=False)
    say("powering off")
    subprocess.run(["systemctl", "--no-block", "poweroff"], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "after"))
