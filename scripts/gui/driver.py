#!/usr/bin/env python3
"""Drives dirseal-settings through the accessibility tree (AT-SPI), as a person would: finds each
control by its role and accessible name, clicks and types, reads what the window says and checks
it against the service's own answers over the system bus. Run by scripts/gui-test.sh as the test
user, inside a private session bus (dbus-run-session), with DISPLAY and DBUS_SYSTEM_BUS_ADDRESS set.

Each scenario saves a screenshot into --out. The overview after encryption is also written as JSON
(overview-encrypted.json) for the script to compare with `dirseal status` as root.
"""
import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time

import gi

gi.require_version("Gio", "2.0")
from gi.repository import Gio, GLib  # noqa: E402
import pyatspi  # noqa: E402

PASSWORD = "correct horse battery"
# What one scenario learns and a later one uses (the recovery key the window showed).
RESULTS = {}
NEW_PASSWORD = "staple gun 42"


def fail(msg):
    print(f"gui-test: FAIL: {msg}", file=sys.stderr)
    raise SystemExit(1)


# --- the service, asked directly (the answers the window must agree with) ---------------------

class Service:
    def __init__(self):
        self.bus = Gio.bus_get_sync(Gio.BusType.SYSTEM, None)

    def call(self, method, args, sig, fds=None):
        fdlist = Gio.UnixFDList.new_from_array(fds) if fds else None
        try:
            reply, _ = self.bus.call_with_unix_fd_list_sync(
                "org.dirseal.Dirseal1", "/org/dirseal/Dirseal1", "org.dirseal.Dirseal1", method,
                GLib.Variant(sig, args), None, Gio.DBusCallFlags.NONE, 60000, fdlist, None)
        except GLib.Error as e:
            name = Gio.DBusError.get_remote_error(e)
            # The message without GDBus's "GDBus.Error:NAME: " prefix (pygobject cannot strip it
            # in place).
            return None, name, e.message.removeprefix(f"GDBus.Error:{name}: ")
        return reply.unpack(), None, None

    def ok(self, method, args, sig, fds=None):
        reply, name, msg = self.call(method, args, sig, fds)
        if name is not None:
            fail(f"{method}: {name}: {msg}")
        return reply

    def status(self, home):
        return self.ok("GetStatus", (home,), "(s)")[0]

    def plan(self, home):
        return self.ok("PlanConvert", (home, {}), "(sa{sv})")[0]


def secret_fd(text):
    r, w = os.pipe()
    os.write(w, text.encode())
    os.close(w)
    return r


# --- how the app words figures (gui/src/text.rs: change both together) ------------------------

def size(n):
    return GLib.format_size(n)


def duration(s):
    if s < 60:
        return "less than a minute"
    if s < 3600:
        return f"about {-(-s // 60)} minutes"
    return f"about {s // 3600} h {-(-(s % 3600) // 60)} min"


# --- the accessibility tree -------------------------------------------------------------------

class App:
    def __init__(self, path, out):
        self.out = out
        self.path = path
        self.shots = []
        self.start()

    def start(self):
        # Started from / : it must hold nothing open in the home it converts.
        self.proc = subprocess.Popen([self.path], cwd="/", env=dict(os.environ), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT)
        self.root = self.wait(self.find_app, "the app on the accessibility bus", 60)

    def find_app(self):
        """This process's app: an app closed a moment ago may still be listed."""
        desktop = pyatspi.Registry.getDesktop(0)
        for i in range(desktop.childCount):
            a = desktop.getChildAtIndex(i)
            if a is not None and a.name == "dirseal-settings" and a.get_process_id() == self.proc.pid:
                return a
        return None

    def wait(self, f, what, timeout=30):
        end = time.time() + timeout
        while time.time() < end:
            if self.proc.poll() is not None:
                fail(f"the app exited ({self.proc.returncode}) while waiting for {what}:\n"
                     + self.proc.stdout.read().decode(errors="replace"))
            try:
                v = f()
            except Exception:  # a node vanishing mid-walk: the window is changing, look again
                v = None
            if v:
                return v
            time.sleep(0.2)
        self.shot("timeout")
        fail(f"timed out waiting for {what}; the window shows: {self.texts()}")

    def nodes(self, node=None):
        """Every visible node below the app, depth first. GTK 4.8 sets no SHOWING state; the app
        hides a stack's other pages (gui/src/ui.rs `switch`), so what is visible is on screen."""
        node = node or self.root
        out = []
        for i in range(node.childCount):
            c = node.getChildAtIndex(i)
            if c is None:
                continue
            st = c.getState()
            if not st.contains(pyatspi.STATE_VISIBLE):
                continue
            out.append(c)
            out.extend(self.nodes(c))
        return out

    def texts(self):
        return [n.name for n in self.nodes() if n.getRoleName() == "label" and n.name]

    def node(self, role, name, timeout=30):
        def f():
            for n in self.nodes():
                if n.getRoleName() == role and n.name == name:
                    return n
            return None
        return self.wait(f, f"{role} “{name}”", timeout)

    def label_matching(self, pattern, timeout=30):
        rx = re.compile(pattern)

        def f():
            for t in self.texts():
                if rx.search(t):
                    return t
            return None
        return self.wait(f, f"a label matching /{pattern}/", timeout)

    def shows(self, text, timeout=30):
        return self.wait(lambda: text in self.texts(), f"the text “{text}”", timeout)

    def value(self, name):
        """The value beside a summary line's name (gui/src/ui.rs `row`: name label, value label)."""
        t = self.texts()
        for i, s in enumerate(t[:-1]):
            if s == name:
                return t[i + 1]
        fail(f"no line “{name}” in {t}")

    def label_after(self, name):
        """The label node that follows the label `name` (a page's title: its first line)."""
        labels = [n for n in self.nodes() if n.getRoleName() == "label"]
        for a, b in zip(labels, labels[1:]):
            if a.name == name:
                return b
        fail(f"no label after “{name}”")

    def values(self, names):
        return {n: self.value(n) for n in names}

    def click(self, role, name, timeout=30):
        n = self.node(role, name, timeout)
        self.wait(lambda: n.getState().contains(pyatspi.STATE_SENSITIVE), f"{role} “{name}” to be enabled")
        n.queryAction().doAction(0)

    def toggle(self, name):
        """Ticks a check box. GTK 4.8's check buttons offer no AT-SPI action and take no focus
        through it: a click at its place on the screen, as a person's."""
        n = self.node("check box", name)
        was = n.getState().contains(pyatspi.STATE_CHECKED)
        e = n.queryComponent().getExtents(pyatspi.DESKTOP_COORDS)
        pyatspi.Registry.generateMouseEvent(e.x + min(12, e.width // 2), e.y + e.height // 2, pyatspi.MOUSE_B1C)
        self.wait(lambda: n.getState().contains(pyatspi.STATE_CHECKED) != was, f"check box “{name}” to change")

    def type(self, role, name, text):
        n = self.node(role, name)
        n.queryEditableText().setTextContents(text)

    def shot(self, name):
        path = os.path.join(self.out, f"{name}.png")
        subprocess.run(["import", "-window", "root", path], check=False)
        self.shots.append(path)
        return path

    def quit(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# --- the scenarios ----------------------------------------------------------------------------

def overview_unencrypted(app, svc, home):
    app.shows("Not encrypted")
    st = svc.status(home)
    if st["encrypted"]:
        fail(f"the service says {home} is encrypted already: {st}")
    if app.value("Folder") != home:
        fail(f"the overview names {app.value('Folder')}, not {home}")
    app.node("push button", "Encrypt my data")
    app.shot("1-overview-not-encrypted")


def tree_digest(home):
    """Names, kinds, sizes and contents of everything in the home: equal before and after a
    cancelled conversion, or the cancel lost or changed something."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(home):
        dirnames.sort()
        for name in sorted(filenames):
            p = os.path.join(dirpath, name)
            h.update(os.path.relpath(p, home).encode() + b"\0")
            with open(p, "rb") as f:
                h.update(hashlib.sha256(f.read()).digest())
        h.update(b"dirs:" + "/".join(dirnames).encode())
    return h.hexdigest()


def start_encryption(app):
    """From the overview to a running job: the plan, the password twice, "Encrypt now"."""
    app.click("push button", "Encrypt my data")
    app.shows("Size", 60)


NOW, LIVE, NEXT_BOOT = "Now", "In the background while I keep working", "At the next boot"


def type_password_and_start(app, start=NOW, check=None):
    """The password twice, then the start chosen (after `check`, if given, looked at the start
    page): the recovery key page follows (the service writes the key as the job starts)."""
    app.type("password text", "Encryption password", PASSWORD)
    app.type("password text", "Repeat the password", PASSWORD)
    app.click("push button", "Next")
    app.node("push button", start)
    if check:
        check()
    app.click("push button", start)
    app.shows("Your recovery key", 30)


def key_shown(app):
    """The recovery key on screen and the group asked (numbered on screen)."""
    key = app.label_matching(r"^[0-9A-Za-z]{2,}(-[0-9A-Za-z]{2,}){3,}$", 60)
    prompt = app.label_matching(r"^To check, type group \d+ of the key$")
    n = int(re.search(r"group (\d+)", prompt).group(1))
    return key, n, key.split("-")[n - 1]


def confirm_key(app):
    key, _, group = key_shown(app)
    app.toggle("I have written it down")
    app.type("text", "Group of the recovery key", group)
    app.click("push button", "Continue")
    return key


LATER = {"Checking the copy", "Putting the encrypted folder in place", "Removing the unencrypted original"}


def watch_label(app, node, want, timeout=60):
    """Whether label `node` comes to say `want`, watched closely (a phase can last under a
    second); False once the page is gone or a phase after the copy shows."""
    end = time.time() + timeout
    while time.time() < end:
        try:
            now = node.name
        except Exception:  # the page is gone: the job ended
            return False
        if now == want:
            return True
        if now.removeprefix("Meanwhile: ") in LATER:
            return False
        time.sleep(0.02)
    return False


def watch_phase(app, want, timeout=60):
    """The progress page's phase line (the line under its title)."""
    return watch_label(app, app.label_after("Encrypting"), want, timeout)


def cancel_mid_copy(app, svc, home):
    before = tree_digest(home)
    start_encryption(app)
    app.click("push button", "Next")
    type_password_and_start(app)
    # The job runs while the recovery key is shown; its page says the phase and can cancel. The
    # copy lasts a few seconds: the button is found first, then only the phase label is watched
    # (one call a look), and the button is pressed the moment copying shows.
    cancel = app.node("push button", "Cancel encryption")
    phase = next(n for n in app.nodes() if n.getRoleName() == "label" and n.name.startswith("Meanwhile: "))
    if not watch_label(app, phase, "Meanwhile: Copying into the encrypted folder"):
        fail("the copy phase never showed before the conversion went past it")
    cancel.queryAction().doAction(0)
    app.shows("Encryption cancelled", 120)
    app.shot("2-cancelled")
    app.click("push button", "Done")
    app.shows("Not encrypted", 30)
    st = svc.status(home)
    if st["encrypted"]:
        fail(f"after a cancel the service says the home is encrypted: {st}")
    if tree_digest(home) != before:
        fail("the home's files differ after the cancelled conversion")


def encrypt_home(app, svc, home):
    start_encryption(app)
    plan = svc.plan(home)
    want = {
        "Size": size(plan["data_bytes"]),
        "Files and folders": str(plan["entries"]),
        "Space needed": f"{size(plan['space_needed'])} of {size(plan['space_available'])} free",
        "Cannot log in meanwhile": plan.get("owner_name") or f"user {plan['owner_uid']}",
    }
    if "estimate" in plan:
        want["Time"] = duration(plan["estimate"]["seconds"])
    shown = app.values(list(want))
    for k, v in want.items():
        # The free space moves between two plans by the filesystem's own bookkeeping: compare
        # the space line's first figure (what the copy needs) exactly, the free space by its
        # presence.
        if k == "Space needed":
            if not shown[k].startswith(size(plan["space_needed"]) + " of "):
                fail(f"plan line {k}: window says “{shown[k]}”, the service “{v}”")
        elif shown[k] != v:
            fail(f"plan line {k}: window says “{shown[k]}”, the service “{v}”")
    app.shot("3-plan")
    app.click("push button", "Next")

    # The password twice; a mismatch first, which the page must refuse in words.
    app.type("password text", "Encryption password", PASSWORD)
    app.type("password text", "Repeat the password", PASSWORD + "x")
    app.click("push button", "Next")
    app.label_matching(r"^The passwords do not match")
    app.shot("4-password-mismatch")
    type_password_and_start(app)
    # The key comes first: the service made it as the job started, before encrypting anything.
    key, n, group = key_shown(app)
    app.shot("6-recovery-key")
    RESULTS["recovery_key"] = key
    # Continue needs the box ticked; a wrong group is refused in words.
    app.type("text", "Group of the recovery key", group)
    continue_btn = app.node("push button", "Continue")
    if continue_btn.getState().contains(pyatspi.STATE_SENSITIVE):
        fail("Continue is enabled before “I have written it down” is ticked")
    app.toggle("I have written it down")
    wrong = "0000" if group != "0000" else "1111"
    app.type("text", "Group of the recovery key", wrong)
    app.click("push button", "Continue")
    app.label_matching(rf"^That is not group {n} of the key")
    app.type("text", "Group of the recovery key", group.lower())
    app.click("push button", "Continue")
    # Then the progress, if the job still runs (the bar moves through its Progress signals).
    if "Encrypting" in app.texts():
        app.shot("5-progress")
    app.shows("Your data is encrypted", 300)
    # The key shown is the directory's: the service says it opens it.
    valid = svc.ok("RecoveryVerify", (home, 0), "(sh)", [secret_fd(key)])[0]
    if not valid:
        fail("the recovery key the window shows does not open the home (RecoveryVerify: false)")
    app.label_matching(r"deleted, but a disk keeps deleted data")
    app.shot("7-result")
    app.click("push button", "Done")

    app.shows("Encrypted", 30)
    st = svc.status(home)
    shown = app.values(["Encryption", "Lock", "Recovery key", "Opened by"])
    want_lock = {"unlocked": "Unlocked", "locked": "Locked"}.get(st["key"], st["key"])
    if not st["encrypted"] or shown["Lock"] != want_lock or shown["Recovery key"] != ("Present" if st["recovery_key"] else "None"):
        fail(f"overview {shown} disagrees with GetStatus {st}")
    names = [p["name"] for p in st["protectors"]]
    if not all(n in shown["Opened by"] for n in names):
        fail(f"overview's protectors “{shown['Opened by']}” do not name {names}")
    with open(os.path.join(app.out, "overview-encrypted.json"), "w") as f:
        json.dump(shown, f)
    app.shot("8-overview-encrypted")


def conversion(svc, home):
    return svc.status(home)["conversion"]


def scheduled_then_cancelled(app, svc, home):
    """At the next boot: the key first, then the job ends at once "scheduled"; the overview says
    so as GetStatus does; "Cancel the scheduled encryption" takes it back and the home is as it
    was."""
    before = tree_digest(home)
    start_encryption(app)
    app.click("push button", "Next")
    type_password_and_start(app, NEXT_BOOT)
    confirm_key(app)
    app.shows("Encryption scheduled for the next boot", 30)
    app.click("push button", "Done")
    app.shows("Scheduled for the next boot: restart the computer to encrypt", 30)
    if conversion(svc, home) != "scheduled":
        fail(f"the overview says scheduled, GetStatus says {conversion(svc, home)!r}")
    app.shot("12-overview-scheduled")
    app.click("push button", "Cancel the scheduled encryption")
    app.shows("Cancelled; nothing was changed", 30)
    if conversion(svc, home) != "aborted" or svc.status(home)["encrypted"]:
        fail(f"after the cancel GetStatus says {svc.status(home)}")
    if app.value("Encryption") != "Not encrypted" or tree_digest(home) != before:
        fail("the home changed after a cancelled schedule")
    # Scheduled elsewhere (as `dirseal convert --at-next-boot` would, through the service): the
    # overview follows the job's Finished signal by itself, nothing pressed.
    svc.ok("Convert", (home, 0, {"at_next_boot": GLib.Variant("b", True)}), "(sha{sv})", [secret_fd(PASSWORD)])
    app.shows("Scheduled for the next boot: restart the computer to encrypt", 15)
    app.click("push button", "Cancel the scheduled encryption")
    app.shows("Cancelled; nothing was changed", 30)
    if conversion(svc, home) != "aborted" or tree_digest(home) != before:
        fail("the home changed after the second cancelled schedule")


def background_reopened_then_cancelled(app, svc, home):
    """In the background while the user keeps working (a process of theirs in the home): the
    key, then the progress; the window is closed and opened again mid-way and finds the job; it
    says "caught up" as the job's State and GetStatus do; Cancel leaves the home as it was."""
    before = tree_digest(home)
    session = subprocess.Popen(["sleep", "600"], cwd=home)
    try:
        start_encryption(app)
        app.click("push button", "Next")
        def now_as_the_service_says():
            # The home is in use: "Now" is offered exactly as PlanConvert answers, with its words.
            _, name, msg = svc.call("PlanConvert", (home, {}), "(sa{sv})")
            now = app.node("push button", NOW)
            enabled = now.getState().contains(pyatspi.STATE_SENSITIVE)
            if name is None and not enabled:
                fail("“Now” is disabled though PlanConvert accepts it")
            if name is not None:
                if enabled:
                    fail(f"“Now” is offered though PlanConvert says {name}: {msg}")
                app.shows(f"Not possible now: {msg}", 10)
            print(f"gui: “Now” with the home in use: {'refused: ' + msg if name else 'offered'}")
            app.shot("15-start-home-in-use")
        type_password_and_start(app, LIVE, now_as_the_service_says)
        confirm_key(app)
        app.shows("Encrypting", 30)
        phase = app.label_after("Encrypting").name
        print(f"gui: closed the window while it said “{phase}”")
        app.shot("13-background-progress")
        app.quit()
        app.start()
        # Opened again: the app finds the job and shows its state, as the service says it.
        app.shows("Caught up: log out to finish", 120)
        if conversion(svc, home) != "live: caught up, waiting for logout":
            fail(f"the window says caught up, GetStatus says {conversion(svc, home)!r}")
        app.shot("14-background-caught-up")
        app.click("push button", "Cancel encryption")
        app.shows("Encryption cancelled", 120)
        app.click("push button", "Done")
        app.shows("Not encrypted", 30)
        if svc.status(home)["encrypted"] or tree_digest(home) != before:
            fail("the home changed after a cancelled background encryption")
    finally:
        session.kill()
        session.wait()


def change_password(app, svc, home):
    # GTK 4.8 gives toggle buttons the push button role.
    app.click("push button", "Manage")
    # What the service says to a wrong current password, asked directly; the window must say it.
    st = svc.status(home)
    pid = next(p["id"] for p in st["protectors"] if p["kind"] == "password")
    _, name, msg = svc.call("ChangeSecret", (pid, 0, 1), "(shh)", [secret_fd("wrong one"), secret_fd(NEW_PASSWORD)])
    if name is None:
        fail("ChangeSecret accepted a wrong password")
    app.type("password text", "Current password", "wrong one")
    app.type("password text", "New password", NEW_PASSWORD)
    app.type("password text", "Repeat the new password", NEW_PASSWORD)
    app.click("push button", "Change password")
    app.shows(msg, 30)
    app.shot("9-change-password-wrong")
    # And the right one changes it: the service then takes the new password only.
    app.type("password text", "Current password", PASSWORD)
    app.type("password text", "New password", NEW_PASSWORD)
    app.type("password text", "Repeat the new password", NEW_PASSWORD)
    app.click("push button", "Change password")
    app.shows("Password changed.", 30)
    if not svc.ok("VerifySecret", (pid, 0), "(sh)", [secret_fd(NEW_PASSWORD)])[0]:
        fail("the window said “Password changed.” but the new password does not open the protector")
    app.shot("10-change-password-done")


def check_recovery_key(app, svc, home):
    """Manage → "Check the recovery key": a key with one digit changed is refused with the
    service's own words (each group carries a check digit: it names the group to retype); the one
    the wizard showed opens the home."""
    key = RESULTS["recovery_key"]
    wrong = key[:-1] + ("1" if key[-1] != "1" else "2")
    reply, name, msg = svc.call("RecoveryVerify", (home, 0), "(sh)", [secret_fd(wrong)])
    want = msg if name is not None else (
        "This recovery key opens your home." if reply[0] else
        "This recovery key does not open your home. Check what you wrote down.")
    app.type("password text", "Recovery key to check", wrong)
    app.click("push button", "Check the recovery key")
    app.shows(want, 30)
    app.shot("11-recovery-key-wrong")
    app.type("password text", "Recovery key to check", key)
    app.click("push button", "Check the recovery key")
    app.shows("This recovery key opens your home.", 30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--app", required=True)
    ap.add_argument("--home", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    svc = Service()
    app = App(a.app, a.out)
    scenarios = [overview_unencrypted, cancel_mid_copy, scheduled_then_cancelled, background_reopened_then_cancelled,
                 encrypt_home, change_password, check_recovery_key]
    try:
        for s in scenarios:
            t = time.time()
            s(app, svc, a.home)
            print(f"gui: {s.__name__} ok ({time.time() - t:.1f} s)")
    finally:
        app.quit()
    with open(os.path.join(a.out, "scenarios"), "w") as f:
        f.write(str(len(scenarios)))


if __name__ == "__main__":
    main()
