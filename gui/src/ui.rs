//! The window: Overview, Manage, and the "Encrypt my data" wizard.
//!
//! Every D-Bus call is awaited in a future on GTK's main context; zbus does the socket work on
//! its own thread, so the window never waits on the service. Each control has a visible label that
//! is also its accessible name: scripts/gui/driver.py (and a screen reader) find them by it.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

use adw::prelude::*;
use futures_util::StreamExt;
use gtk::accessible::Property;
use gtk::glib;
use zbus::zvariant::Fd;
use zeroize::Zeroizing;

use crate::bus::{self, DirsealProxy, JobProxy, Plan, Status};
use crate::text::{self, Recorded};

/// Pages of the wizard, in order.
const PLAN: &str = "plan";
const PASSWORD: &str = "password";
const START: &str = "start";
const PROGRESS: &str = "progress";
const RECOVERY: &str = "recovery";
const RESULT: &str = "result";

struct Ui {
    /// The user's home, from the password database (not `$HOME`, which the caller controls and
    /// which the app may be pointed away from: nothing may hold the home open while it converts).
    home: String,
    uid: u32,
    conn: RefCell<Option<zbus::Connection>>,
    status: RefCell<Status>,

    main: gtk::Stack,
    tabs: gtk::Box,
    t_overview: gtk::ToggleButton,
    t_manage: gtk::ToggleButton,
    refresh: gtk::Button,
    plan_back: gtk::Button,
    pw_back: gtk::Button,
    pw_next: gtk::Button,
    start_back: gtk::Button,
    done: gtk::Button,
    views: gtk::Stack,
    overview: gtk::Box,
    overview_error: gtk::Label,
    encrypt: gtk::Button,
    show_progress: gtk::Button,
    cancel_scheduled: gtk::Button,

    wizard: gtk::Stack,
    plan_rows: gtk::Box,
    plan_error: gtk::Label,
    plan_next: gtk::Button,
    pw1: gtk::PasswordEntry,
    pw2: gtk::PasswordEntry,
    pw_error: gtk::Label,
    start_error: gtk::Label,
    /// The three starts, each with the line under it (what it does, or why it is not offered).
    starts: [(gtk::Button, gtk::Label); 3],
    key_phase: gtk::Label,
    key_cancel: gtk::Button,
    phase: gtk::Label,
    bar: gtk::ProgressBar,
    eta: gtk::Label,
    cancel: gtk::Button,
    progress_error: gtk::Label,
    progress_back: gtk::Button,
    key: gtk::Label,
    written: gtk::CheckButton,
    group_prompt: gtk::Label,
    group: gtk::Entry,
    recovery_error: gtk::Label,
    recovery_next: gtk::Button,
    result_title: gtk::Label,
    result_note: gtk::Label,

    old: gtk::PasswordEntry,
    new1: gtk::PasswordEntry,
    new2: gtk::PasswordEntry,
    change: gtk::Button,
    manage_message: gtk::Label,
    recovery_check: gtk::PasswordEntry,
    check_key: gtk::Button,
    recovery_message: gtk::Label,

    /// The new password, kept from its page until the recovery key is made with it.
    password: RefCell<Option<Zeroizing<String>>>,
    recovery: RefCell<Option<Zeroizing<String>>>,
    group_index: Cell<usize>,
    job: RefCell<Option<JobProxy<'static>>>,
    /// The plan's starts the service accepts, with the reason for each it refuses.
    allowed: RefCell<[Result<(), String>; 3]>,
    /// The recovery key was confirmed (or none is to be): the job's end may be shown.
    key_done: Cell<bool>,
    /// How the job ended, kept while the recovery key is still being confirmed.
    ended: RefCell<Option<Ended>>,
    /// A running job was looked for once, when the window opened.
    looked: Cell<bool>,
}

/// When the conversion runs: `Convert`'s options (docs/dbus.md, "Conversions").
#[derive(Clone, Copy, PartialEq, Eq)]
enum Start {
    Now,
    Live,
    NextBoot,
}

impl Start {
    const ALL: [Start; 3] = [Start::Now, Start::Live, Start::NextBoot];

    fn option(self) -> Option<&'static str> {
        match self {
            Start::Now => None,
            Start::Live => Some("live"),
            Start::NextBoot => Some("at_next_boot"),
        }
    }

    fn options(self) -> HashMap<&'static str, zbus::zvariant::Value<'static>> {
        self.option().map(|o| (o, zbus::zvariant::Value::from(true))).into_iter().collect()
    }
}

/// How a followed job ended.
enum Ended {
    /// `Finished`'s state: "done", "swapped", "aborted", "scheduled".
    State(String),
    /// `Failed`'s message.
    Failed(String),
}

pub fn build(app: &adw::Application) {
    let (uid, home) = match whoami() {
        Ok(v) => v,
        Err(e) => {
            // No home to show: say so in a window rather than vanish.
            let l = label(&format!("Your account could not be looked up: {e}"));
            adw::ApplicationWindow::builder().application(app).title("Encryption").content(&l).build().present();
            return;
        }
    };
    let ui = Rc::new(Ui::new(home, uid));
    ui.connect();
    let header = adw::HeaderBar::new();
    header.set_title_widget(Some(&ui.tabs));
    let content = gtk::Box::new(gtk::Orientation::Vertical, 0);
    content.append(&header);
    content.append(&ui.main);
    let window = adw::ApplicationWindow::builder()
        .application(app)
        .title("Encryption")
        .default_width(720)
        .default_height(820)
        .content(&content)
        .build();
    window.present();
    ui.refresh();
    ui.listen();
}

/// The caller's uid and home directory from the password database.
fn whoami() -> anyhow::Result<(u32, String)> {
    let uid = nix::unistd::getuid();
    let user = nix::unistd::User::from_uid(uid)?.ok_or_else(|| anyhow::anyhow!("uid {uid} has no passwd entry"))?;
    let home = user.dir.to_str().ok_or_else(|| anyhow::anyhow!("the home's name is not UTF-8"))?.to_owned();
    Ok((uid.as_raw(), home))
}

fn label(s: &str) -> gtk::Label {
    let l = gtk::Label::new(Some(s));
    l.set_wrap(true);
    l.set_xalign(0.0);
    l
}

/// A line for errors: red, wrapped, hidden while empty (`say`).
fn error_label() -> gtk::Label {
    let l = label("");
    l.add_css_class("error");
    l.set_visible(false);
    l.set_selectable(true);
    l
}

/// Puts a message in a label that is hidden while it has none.
fn say(l: &gtk::Label, msg: &str) {
    l.set_text(msg);
    l.set_visible(!msg.is_empty());
}

/// A large button: fingers and game pads, not only a mouse.
fn button(s: &str) -> gtk::Button {
    let b = gtk::Button::with_label(s);
    b.set_height_request(48);
    b.add_css_class("pill");
    b
}

fn password_entry(name: &str) -> gtk::PasswordEntry {
    let e = gtk::PasswordEntry::new();
    e.set_show_peek_icon(true);
    e.set_height_request(44);
    e.update_property(&[Property::Label(name)]);
    e
}

/// A page: a column of widgets, centred and scrollable.
fn page(children: &[&gtk::Widget]) -> (gtk::ScrolledWindow, gtk::Box) {
    let col = gtk::Box::new(gtk::Orientation::Vertical, 14);
    col.set_margin_top(24);
    col.set_margin_bottom(24);
    col.set_margin_start(18);
    col.set_margin_end(18);
    for c in children {
        col.append(*c);
    }
    let clamp = adw::Clamp::builder().maximum_size(560).child(&col).build();
    (gtk::ScrolledWindow::builder().child(&clamp).vexpand(true).hscrollbar_policy(gtk::PolicyType::Never).build(), col)
}

fn title(s: &str) -> gtk::Label {
    let l = label(s);
    l.add_css_class("title-2");
    l
}

/// One "Name: value" line of a summary. Both are labels a screen reader reads in order.
fn row(into: &gtk::Box, name: &str, value: &str) {
    let r = gtk::Box::new(gtk::Orientation::Horizontal, 12);
    let n = label(name);
    n.add_css_class("dim-label");
    n.set_width_chars(22);
    n.set_wrap(false);
    let v = label(value);
    v.set_hexpand(true);
    r.append(&n);
    r.append(&v);
    into.append(&r);
}

/// Shows one page of a stack and hides the others: GTK 4.8 exposes a stack's hidden pages to the
/// accessibility tree as if they were on screen, and a screen reader (or the test) would read them.
fn switch(stack: &gtk::Stack, name: &str) {
    let mut next = stack.first_child();
    while let Some(w) = next {
        w.set_visible(stack.page(&w).name().as_deref() == Some(name));
        next = w.next_sibling();
    }
    stack.set_visible_child_name(name);
}

fn clear(b: &gtk::Box) {
    while let Some(c) = b.first_child() {
        b.remove(&c);
    }
}

fn buttons(children: &[&gtk::Button]) -> gtk::Box {
    let b = gtk::Box::new(gtk::Orientation::Horizontal, 12);
    b.set_halign(gtk::Align::End);
    b.set_margin_top(12);
    for c in children {
        b.append(*c);
    }
    b
}

impl Ui {
    fn new(home: String, uid: u32) -> Ui {
        let main = gtk::Stack::new();
        let views = gtk::Stack::new();
        // The two views, as a pair of buttons in the header: hidden while the wizard runs, which
        // is left only by its own buttons.
        let tabs = gtk::Box::new(gtk::Orientation::Horizontal, 0);
        tabs.add_css_class("linked");
        let t_overview = gtk::ToggleButton::with_label("Overview");
        let t_manage = gtk::ToggleButton::with_label("Manage");
        t_manage.set_group(Some(&t_overview));
        t_overview.set_active(true);
        tabs.append(&t_overview);
        tabs.append(&t_manage);
        let wizard = gtk::Stack::new();
        main.add_named(&views, Some("views"));
        main.add_named(&wizard, Some("wizard"));

        let overview = gtk::Box::new(gtk::Orientation::Vertical, 8);
        let overview_error = error_label();
        let encrypt = button("Encrypt my data");
        encrypt.add_css_class("suggested-action");
        encrypt.set_visible(false);
        let refresh = button("Refresh");
        let show_progress = button("Show progress");
        show_progress.add_css_class("suggested-action");
        show_progress.set_visible(false);
        let cancel_scheduled = button("Cancel the scheduled encryption");
        cancel_scheduled.add_css_class("destructive-action");
        cancel_scheduled.set_visible(false);
        let (p, _) = page(&[
            title("Your data").upcast_ref(),
            overview.upcast_ref(),
            overview_error.upcast_ref(),
            buttons(&[&refresh, &cancel_scheduled, &show_progress, &encrypt]).upcast_ref(),
        ]);
        views.add_named(&p, Some("overview"));

        let old = password_entry("Current password");
        let new1 = password_entry("New password");
        let new2 = password_entry("Repeat the new password");
        let change = button("Change password");
        change.add_css_class("suggested-action");
        let manage_message = label("");
        manage_message.set_selectable(true);
        manage_message.set_visible(false);
        let recovery_check = password_entry("Recovery key to check");
        let check_key = button("Check the recovery key");
        let recovery_message = label("");
        recovery_message.set_selectable(true);
        recovery_message.set_visible(false);
        let (p, _) = page(&[
            title("Change password").upcast_ref(),
            label("Current password").upcast_ref(),
            old.upcast_ref(),
            label("New password").upcast_ref(),
            new1.upcast_ref(),
            label("Repeat the new password").upcast_ref(),
            new2.upcast_ref(),
            manage_message.upcast_ref(),
            buttons(&[&change]).upcast_ref(),
            title("Recovery key").upcast_ref(),
            label("Check that the recovery key you wrote down opens your home. Nothing is unlocked or changed.")
                .upcast_ref(),
            recovery_check.upcast_ref(),
            recovery_message.upcast_ref(),
            buttons(&[&check_key]).upcast_ref(),
        ]);
        views.add_named(&p, Some("manage"));

        // The wizard's pages.
        let plan_rows = gtk::Box::new(gtk::Orientation::Vertical, 8);
        let plan_error = error_label();
        let plan_back = button("Cancel");
        let plan_next = button("Next");
        plan_next.add_css_class("suggested-action");
        let (p, _) = page(&[
            title("What will happen").upcast_ref(),
            label("Your home folder is encrypted in place: its files stay where they are and only you can open them, with your password.").upcast_ref(),
            plan_rows.upcast_ref(),
            plan_error.upcast_ref(),
            buttons(&[&plan_back, &plan_next]).upcast_ref(),
        ]);
        wizard.add_named(&p, Some(PLAN));

        let pw1 = password_entry("Encryption password");
        let pw2 = password_entry("Repeat the password");
        let pw_error = error_label();
        let pw_back = button("Back");
        let pw_next = button("Next");
        pw_next.add_css_class("suggested-action");
        let (p, _) = page(&[
            title("Choose a password").upcast_ref(),
            label("It opens your encrypted home, so use one you will remember: your login password is a good choice, and then logging in opens it.").upcast_ref(),
            label("Encryption password").upcast_ref(),
            pw1.upcast_ref(),
            label("Repeat the password").upcast_ref(),
            pw2.upcast_ref(),
            pw_error.upcast_ref(),
            buttons(&[&pw_back, &pw_next]).upcast_ref(),
        ]);
        wizard.add_named(&p, Some(PASSWORD));

        let start_error = error_label();
        let start_back = button("Back");
        let starts = [
            (button("Now"), label("")),
            (button("In the background while I keep working"), label("")),
            (button("At the next boot"), label("")),
        ];
        let (start_title, start_intro) = (
            title("When to encrypt"),
            label("Then you get a recovery key to write down: it opens your data if you forget the password. You can close this window at any time; the work goes on."),
        );
        let mut children: Vec<&gtk::Widget> = vec![start_title.upcast_ref(), start_intro.upcast_ref()];
        for (b, l) in &starts {
            b.set_halign(gtk::Align::Start);
            l.add_css_class("dim-label");
            children.push(b.upcast_ref());
            children.push(l.upcast_ref());
        }
        let back_row = buttons(&[&start_back]);
        children.push(start_error.upcast_ref());
        children.push(back_row.upcast_ref());
        let (p, _) = page(&children);
        wizard.add_named(&p, Some(START));

        let phase = label("Starting");
        phase.add_css_class("title-4");
        let bar = gtk::ProgressBar::new();
        bar.set_show_text(true);
        bar.set_height_request(24);
        bar.update_property(&[Property::Label("Progress")]);
        let eta = label("Time left: estimating");
        let progress_error = error_label();
        let cancel = button("Cancel encryption");
        cancel.add_css_class("destructive-action");
        let progress_back = button("Back to overview");
        progress_back.set_visible(false);
        let (p, _) = page(&[
            title("Encrypting").upcast_ref(),
            phase.upcast_ref(),
            bar.upcast_ref(),
            eta.upcast_ref(),
            progress_error.upcast_ref(),
            buttons(&[&cancel, &progress_back]).upcast_ref(),
        ]);
        wizard.add_named(&p, Some(PROGRESS));

        let key = label("");
        key.add_css_class("title-1");
        key.add_css_class("monospace");
        key.set_selectable(true);
        key.set_xalign(0.5);
        let written = gtk::CheckButton::with_label("I have written it down");
        written.set_height_request(44);
        let group_prompt = label("");
        let group = gtk::Entry::new();
        group.set_height_request(44);
        group.update_property(&[Property::Label("Group of the recovery key")]);
        let recovery_error = error_label();
        let key_phase = label("");
        key_phase.add_css_class("dim-label");
        let key_cancel = button("Cancel encryption");
        key_cancel.add_css_class("destructive-action");
        let recovery_next = button("Continue");
        recovery_next.add_css_class("suggested-action");
        recovery_next.set_sensitive(false);
        let (p, _) = page(&[
            title("Your recovery key").upcast_ref(),
            label("Write this key down and keep it somewhere safe, away from this computer. It is shown only now. With it you can open your data if you forget your password.").upcast_ref(),
            key.upcast_ref(),
            written.upcast_ref(),
            group_prompt.upcast_ref(),
            group.upcast_ref(),
            recovery_error.upcast_ref(),
            buttons(&[&recovery_next]).upcast_ref(),
            key_phase.upcast_ref(),
            buttons(&[&key_cancel]).upcast_ref(),
        ]);
        wizard.add_named(&p, Some(RECOVERY));

        let result_title = title("");
        let result_note = label("");
        let done = button("Done");
        done.add_css_class("suggested-action");
        let (p, _) = page(&[result_title.upcast_ref(), result_note.upcast_ref(), buttons(&[&done]).upcast_ref()]);
        wizard.add_named(&p, Some(RESULT));

        switch(&views, "overview");
        switch(&wizard, PLAN);
        switch(&main, "views");
        Ui {
            tabs,
            t_overview,
            t_manage,
            refresh,
            plan_back,
            pw_back,
            pw_next,
            start_back,
            done,
            home,
            uid,
            conn: RefCell::new(None),
            status: RefCell::new(Status::default()),
            main,
            views,
            overview,
            overview_error,
            encrypt,
            show_progress,
            cancel_scheduled,
            wizard,
            plan_rows,
            plan_error,
            plan_next,
            pw1,
            pw2,
            pw_error,
            start_error,
            starts,
            key_phase,
            key_cancel,
            phase,
            bar,
            eta,
            cancel,
            progress_error,
            progress_back,
            key,
            written,
            group_prompt,
            group,
            recovery_error,
            recovery_next,
            result_title,
            result_note,
            old,
            new1,
            new2,
            change,
            manage_message,
            recovery_check,
            check_key,
            recovery_message,
            password: RefCell::new(None),
            recovery: RefCell::new(None),
            group_index: Cell::new(0),
            job: RefCell::new(None),
            allowed: RefCell::new([Ok(()), Ok(()), Ok(())]),
            key_done: Cell::new(true),
            ended: RefCell::new(None),
            looked: Cell::new(false),
        }
    }

    /// Wires the buttons whose handlers need the shared state.
    fn connect(self: &Rc<Self>) {
        self.t_overview.connect_toggled(clone(self, |ui, b: &gtk::ToggleButton| {
            if b.is_active() {
                switch(&ui.views, "overview");
                ui.refresh();
            }
        }));
        self.t_manage.connect_toggled(clone(self, |ui, b: &gtk::ToggleButton| {
            if b.is_active() {
                switch(&ui.views, "manage");
                ui.refresh();
            }
        }));
        self.encrypt.connect_clicked(clone(self, |ui, _| ui.open_wizard()));
        self.plan_next.connect_clicked(clone(self, |ui, _| switch(&ui.wizard, PASSWORD)));
        for (start, (b, _)) in Start::ALL.into_iter().zip(&self.starts) {
            b.connect_clicked(clone(self, move |ui, _| ui.begin(start)));
        }
        self.cancel.connect_clicked(clone(self, |ui, _| ui.cancel_job()));
        self.key_cancel.connect_clicked(clone(self, |ui, _| ui.cancel_job()));
        self.show_progress.connect_clicked(clone(self, |ui, _| ui.find_job()));
        self.cancel_scheduled.connect_clicked(clone(self, |ui, _| ui.cancel_schedule()));
        self.written.connect_toggled(clone(self, |ui, _| ui.check_group()));
        self.group.connect_changed(clone(self, |ui, _| ui.check_group()));
        self.recovery_next.connect_clicked(clone(self, |ui, _| ui.confirm_recovery()));
        self.change.connect_clicked(clone(self, |ui, _| ui.change_password()));
        self.check_key.connect_clicked(clone(self, |ui, _| ui.check_recovery_key()));
        self.refresh.connect_clicked(clone(self, |ui, _| ui.refresh()));
        self.pw_next.connect_clicked(clone(self, |ui, _| ui.check_passwords()));
        self.pw_back.connect_clicked(clone(self, |ui, _| switch(&ui.wizard, PLAN)));
        self.start_back.connect_clicked(clone(self, |ui, _| switch(&ui.wizard, PASSWORD)));
        for b in [&self.plan_back, &self.progress_back, &self.done] {
            b.connect_clicked(clone(self, |ui, _| ui.close_wizard()));
        }
    }

    /// Runs a future on the main context with the shared state.
    fn spawn<F, Fut>(self: &Rc<Self>, f: F)
    where
        F: FnOnce(Rc<Ui>) -> Fut,
        Fut: std::future::Future<Output = ()> + 'static,
    {
        glib::MainContext::default().spawn_local(f(self.clone()));
    }

    async fn connection(&self) -> zbus::Result<zbus::Connection> {
        let have = self.conn.borrow().clone();
        if let Some(c) = have {
            return Ok(c);
        }
        let c = zbus::Connection::system().await?;
        *self.conn.borrow_mut() = Some(c.clone());
        Ok(c)
    }

    async fn proxy(&self) -> zbus::Result<DirsealProxy<'static>> {
        DirsealProxy::new(&self.connection().await?).await
    }

    /// The overview follows the service: a job's Finished, Failed or Deferred (sent to each of the
    /// owner's connections, docs/dbus.md) means the home's state changed, whoever started the job.
    fn listen(self: &Rc<Self>) {
        self.spawn(|ui| async move {
            let Ok(conn) = ui.connection().await else { return };
            let mut messages = zbus::MessageStream::from(&conn);
            while let Some(m) = messages.next().await {
                let Ok(m) = m else { continue };
                let h = m.header();
                if h.message_type() == zbus::message::Type::Signal
                    && h.interface().map(|i| i.as_str()) == Some("org.dirseal.Dirseal1.Job")
                    && matches!(h.member().map(|m| m.as_str()), Some("Finished" | "Failed" | "Deferred"))
                {
                    ui.refresh();
                }
            }
        });
    }

    fn refresh(self: &Rc<Self>) {
        self.spawn(|ui| async move {
            let r = match ui.proxy().await {
                Ok(p) => p.get_status(&ui.home).await,
                Err(e) => Err(e),
            };
            match r {
                Ok(s) => {
                    say(&ui.overview_error, "");
                    ui.show_status(&s);
                    let recorded = text::conversion(s.conversion.as_deref().unwrap_or("")).1;
                    *ui.status.borrow_mut() = s;
                    // Opened while a conversion runs (after closing the window, or a restart):
                    // its progress is shown again, once.
                    if !ui.looked.replace(true) && recorded == Recorded::Live {
                        ui.find_job();
                    }
                }
                Err(e) => say(&ui.overview_error, &bus::error_text(&e)),
            }
        });
    }

    fn show_status(&self, s: &Status) {
        let b = &self.overview;
        clear(b);
        let encrypted = s.encrypted.unwrap_or(false);
        let conversion = s.conversion.clone().unwrap_or_default();
        row(b, "Folder", s.path.as_deref().unwrap_or(&self.home));
        row(b, "Encryption", if encrypted { "Encrypted" } else { "Not encrypted" });
        if encrypted {
            row(b, "Lock", text::key_state(s.key.as_deref().unwrap_or("")));
            let mine: Vec<String> = s
                .protectors
                .iter()
                .flatten()
                .map(|p| {
                    format!(
                        "{} ({})",
                        p.name.as_deref().unwrap_or("unnamed"),
                        text::protector_kind(p.kind.as_deref().unwrap_or(""))
                    )
                })
                .collect();
            row(b, "Opened by", &if mine.is_empty() { "Nothing".to_owned() } else { mine.join(", ") });
            row(b, "Recovery key", if s.recovery_key.unwrap_or(false) { "Present" } else { "None" });
        }
        let (said, recorded) =
            if conversion.is_empty() { (String::new(), Recorded::Finished) } else { text::conversion(&conversion) };
        if !said.is_empty() {
            row(b, "Last encryption", &said);
        }
        let autologin = s.autologin.clone().unwrap_or_default();
        row(b, "Automatic login", if autologin.is_empty() { "Off" } else { &autologin });
        for p in s.problems.iter().flatten() {
            row(b, "Problem", p);
        }
        for w in s.warnings.iter().flatten() {
            row(b, "Warning", w);
        }
        // A conversion left unfinished is finished by the same button: Convert resumes it.
        let unfinished = recorded == Recorded::Unfinished;
        self.encrypt.set_label(if unfinished { "Finish encrypting" } else { "Encrypt my data" });
        self.encrypt.set_visible((!encrypted && matches!(recorded, Recorded::Finished)) || unfinished);
        self.show_progress.set_visible(recorded == Recorded::Live);
        self.cancel_scheduled.set_visible(recorded == Recorded::Scheduled);
    }

    fn open_wizard(self: &Rc<Self>) {
        clear(&self.plan_rows);
        row(&self.plan_rows, "Checking", "Looking at your data");
        say(&self.plan_error, "");
        self.plan_next.set_sensitive(false);
        for e in [&self.pw1, &self.pw2] {
            e.set_text("");
        }
        say(&self.pw_error, "");
        say(&self.start_error, "");
        switch(&self.wizard, PLAN);
        switch(&self.main, "wizard");
        self.tabs.set_visible(false);
        self.spawn(|ui| async move {
            // The service says which starts it accepts: each is planned with its option, and a
            // refusal (a home in use cannot be converted now, a move cannot run live) is its
            // reason not to offer it.
            let mut shown = None;
            let mut allowed = [Ok(()), Ok(()), Ok(())];
            let mut first_error = None;
            for (i, start) in Start::ALL.into_iter().enumerate() {
                let r = match ui.proxy().await {
                    Ok(p) => p.plan_convert(&ui.home, start.options()).await,
                    Err(e) => Err(e),
                };
                match r {
                    Ok(plan) => {
                        // An unfinished conversion is resumed as it was started: only "Now".
                        let resume = plan.state.is_some();
                        shown.get_or_insert(plan);
                        if resume {
                            allowed = [Ok(()), Err(String::new()), Err(String::new())];
                            break;
                        }
                    }
                    Err(e) => {
                        let msg = bus::error_text(&e);
                        first_error.get_or_insert(msg.clone());
                        allowed[i] = Err(msg);
                    }
                }
            }
            clear(&ui.plan_rows);
            match shown {
                Some(plan) => {
                    ui.show_plan(&plan);
                    ui.show_starts(&allowed);
                    *ui.allowed.borrow_mut() = allowed;
                    ui.plan_next.set_sensitive(true);
                }
                None => say(&ui.plan_error, &first_error.unwrap_or_default()),
            }
        });
    }

    /// The start page's buttons: those the service refused are shown disabled with its reason.
    fn show_starts(&self, allowed: &[Result<(), String>; 3]) {
        let what = [
            "Encrypts now. Nothing may use your home meanwhile: log out of other sessions and close programs that have files open in it.",
            "Copies your files in the background while you keep working; it finishes when you log out.",
            "Encrypts when the computer starts next, before anyone logs in. Restart when it suits you.",
        ];
        for ((b, l), (ok, what)) in self.starts.iter().zip(allowed.iter().zip(what)) {
            // An empty reason: not a start at all (a resumed conversion goes on as it began).
            let offered = !matches!(ok, Err(m) if m.is_empty());
            b.set_sensitive(ok.is_ok());
            b.set_visible(offered);
            l.set_visible(offered);
            match ok {
                Ok(()) => l.set_text(what),
                Err(why) => l.set_text(&format!("Not possible now: {why}")),
            }
        }
    }

    fn show_plan(&self, p: &Plan) {
        let b = &self.plan_rows;
        if let Some(state) = &p.state {
            row(b, "Unfinished", &format!("An earlier encryption stopped ({state}); it continues where it stopped."));
            return;
        }
        row(b, "Size", &text::size(p.data_bytes.unwrap_or(0)));
        row(b, "Files and folders", &p.entries.unwrap_or(0).to_string());
        row(
            b,
            "Space needed",
            &format!(
                "{} of {} free",
                text::size(p.space_needed.unwrap_or(0)),
                text::size(p.space_available.unwrap_or(0))
            ),
        );
        let time = match p.estimate.and_then(|e| e.seconds) {
            Some(s) => text::duration(s),
            None => "cannot be estimated".to_owned(),
        };
        row(b, "Time", &time);
        let how = match p.method.as_deref() {
            Some("move") => {
                "Move: files go into the encrypted folder a few at a time (the disk is too full for a copy)"
            }
            _ => "Copy: the files are copied into an encrypted folder, which then takes the place of the original",
        };
        row(b, "Method", how);
        let who = p.owner_name.clone().unwrap_or_else(|| format!("user {}", p.owner_uid.unwrap_or(0)));
        row(b, "Cannot log in meanwhile", &who);
    }

    fn check_passwords(&self) {
        let (a, b) = (Zeroizing::new(self.pw1.text().to_string()), Zeroizing::new(self.pw2.text().to_string()));
        if a.is_empty() {
            say(&self.pw_error, "Type a password.");
        } else if a != b {
            say(&self.pw_error, "The passwords do not match. Type the same password twice.");
        } else {
            say(&self.pw_error, "");
            *self.password.borrow_mut() = Some(a);
            self.show_starts(&self.allowed.borrow());
            switch(&self.wizard, START);
        }
    }

    fn close_wizard(self: &Rc<Self>) {
        *self.password.borrow_mut() = None;
        *self.recovery.borrow_mut() = None;
        self.key.set_text("");
        for e in [&self.pw1, &self.pw2] {
            e.set_text("");
        }
        switch(&self.main, "views");
        self.tabs.set_visible(true);
        self.refresh();
    }

    /// Starts the conversion as chosen, with its recovery key made first (`recovery_key_out`):
    /// the key page shows it while the job runs, and the job's end is shown once it is confirmed.
    fn begin(self: &Rc<Self>, start: Start) {
        let Some(password) = self.password.borrow().clone() else { return };
        for (b, _) in &self.starts {
            b.set_sensitive(false);
        }
        say(&self.start_error, "");
        self.spawn(move |ui| async move {
            let r = ui.start_job(&password, start).await;
            ui.show_starts(&ui.allowed.borrow());
            if let Err(e) = r {
                say(&ui.start_error, &bus::error_text(&e));
                switch(&ui.wizard, START);
            }
        });
    }

    async fn start_job(self: &Rc<Self>, password: &str, start: Start) -> zbus::Result<()> {
        let io = |e: std::io::Error| zbus::Error::InputOutput(e.into());
        let conn = self.connection().await?;
        let proxy = DirsealProxy::new(&conn).await?;
        // Listening starts before the job exists: its signals come to this connection by name
        // (docs/dbus.md) from its first moment, and a stream made later would miss the first.
        let messages = zbus::MessageStream::from(&conn);
        let secret = bus::secret_pipe(password).map_err(io)?;
        let (key_r, key_w) = rustix::pipe::pipe().map_err(|e| io(e.into()))?;
        let mut options = start.options();
        options.insert("recovery_key_out", zbus::zvariant::Value::from(Fd::from(&key_w)));
        let path = proxy.convert(&self.home, Fd::from(&secret), options).await?;
        drop((secret, key_w));
        // The service writes the key as the job starts (a resumed conversion makes none): read off
        // the main loop, which must go on drawing.
        let key = gtk::gio::spawn_blocking(move || {
            let mut key = Zeroizing::new(String::new());
            let _ = std::io::Read::read_to_string(&mut std::fs::File::from(key_r), &mut key);
            Zeroizing::new(key.trim().to_owned())
        })
        .await
        .unwrap_or_default();
        self.key_done.set(key.is_empty());
        *self.ended.borrow_mut() = None;
        self.reset_progress();
        if key.is_empty() {
            switch(&self.wizard, PROGRESS);
        } else {
            self.show_key(key);
        }
        self.follow(&conn, messages, path).await
    }

    fn reset_progress(&self) {
        self.phase.set_text(&text::phase("scanning"));
        self.key_phase.set_text(&format!("Meanwhile: {}", text::phase("scanning")));
        self.bar.set_fraction(0.0);
        self.bar.set_text(None);
        self.eta.set_text("Time left: estimating");
        say(&self.progress_error, "");
        for b in [&self.cancel, &self.key_cancel] {
            b.set_visible(true);
            b.set_sensitive(true);
        }
        self.progress_back.set_visible(false);
    }

    /// Follows job `path` to its end: Progress, Deferred, Finished, Failed, and its State (a live
    /// conversion's "caught up" is a state, not a signal), looked at every second.
    async fn follow(
        self: &Rc<Self>,
        conn: &zbus::Connection,
        mut messages: zbus::MessageStream,
        path: zbus::zvariant::OwnedObjectPath,
    ) -> zbus::Result<()> {
        let job = JobProxy::builder(conn)
            .path(path.clone())?
            .cache_properties(zbus::proxy::CacheProperties::No)
            .build()
            .await?;
        *self.job.borrow_mut() = Some(job.clone());
        let weak = Rc::downgrade(self);
        let watched = path.clone();
        glib::timeout_add_local(std::time::Duration::from_secs(1), move || {
            let Some(ui) = weak.upgrade() else { return glib::ControlFlow::Break };
            let current = ui.job.borrow().as_ref().map(|j| j.inner().path().to_owned());
            if current.as_ref().map(|p| p.as_str()) != Some(watched.as_str()) {
                return glib::ControlFlow::Break;
            }
            let job = job.clone();
            ui.spawn(|ui| async move {
                if let Ok(state) = job.state().await {
                    if let Some(said) = text::job_state(&state) {
                        ui.phase.set_text(&said);
                        ui.key_phase.set_text(&format!("Meanwhile: {said}"));
                        ui.eta.set_text(&text::job_state_note(&state));
                    }
                }
            });
            glib::ControlFlow::Continue
        });
        while let Some(m) = messages.next().await {
            let Ok(m) = m else { continue };
            let h = m.header();
            if h.message_type() != zbus::message::Type::Signal || h.path().map(|p| p.as_str()) != Some(path.as_str()) {
                continue;
            }
            match h.member().map(|m| m.as_str()) {
                Some("Progress") => {
                    let Ok((phase, done, total, _, _, eta)) =
                        m.body().deserialize::<(String, u64, u64, u64, u64, i64)>()
                    else {
                        continue;
                    };
                    self.progress(&phase, done, total, eta);
                }
                Some("Deferred") => {
                    let reason = m.body().deserialize::<(String,)>().map(|t| t.0).unwrap_or_default();
                    say(
                        &self.progress_error,
                        &format!("Finishing was put off ({reason}); it finishes at your next logout."),
                    );
                }
                Some("Finished") => {
                    let state = m.body().deserialize::<(String, u64, u64, String)>().map(|t| t.0).unwrap_or_default();
                    self.ended(Ended::State(state));
                    break;
                }
                Some("Failed") => {
                    let (_, msg) = m.body().deserialize::<(String, String)>().unwrap_or_default();
                    self.ended(Ended::Failed(msg));
                    break;
                }
                _ => {}
            }
        }
        *self.job.borrow_mut() = None;
        Ok(())
    }

    fn progress(&self, phase: &str, done: u64, total: u64, eta: i64) {
        self.phase.set_text(&text::phase(phase));
        self.key_phase.set_text(&format!("Meanwhile: {}", text::phase(phase)));
        if total > 0 {
            self.bar.set_fraction((done as f64 / total as f64).clamp(0.0, 1.0));
            self.bar.set_text(Some(&format!("{} of {}", text::size(done), text::size(total))));
        } else {
            self.bar.pulse();
        }
        let left = match u64::try_from(eta) {
            Ok(s) => text::duration(s),
            Err(_) => "estimating".to_owned(),
        };
        self.eta.set_text(&format!("Time left: {left}"));
    }

    /// The job ended: shown now, or once the recovery key is confirmed (a cancelled job's key
    /// opens nothing: that is shown at once).
    fn ended(self: &Rc<Self>, how: Ended) {
        let cancelled = matches!(&how, Ended::State(s) if s == "aborted");
        if self.key_done.get() || cancelled {
            self.key_done.set(true);
            self.show_end(how);
        } else {
            *self.ended.borrow_mut() = Some(how);
        }
    }

    fn show_end(self: &Rc<Self>, how: Ended) {
        self.cancel.set_visible(false);
        *self.recovery.borrow_mut() = None;
        self.key.set_text("");
        let state = match how {
            Ended::Failed(msg) => {
                self.progress_back.set_visible(true);
                say(&self.progress_error, &msg);
                switch(&self.wizard, PROGRESS);
                return;
            }
            Ended::State(s) => s,
        };
        let (title, note) = text::ending(&state);
        self.result_title.set_text(title);
        self.result_note.set_text(note);
        switch(&self.wizard, RESULT);
    }

    /// The recovery key, shown large until confirmed.
    fn show_key(&self, key: Zeroizing<String>) {
        self.written.set_active(false);
        self.group.set_text("");
        say(&self.recovery_error, "");
        let n = text::groups(&key).len().max(1);
        let i = usize::try_from(glib::random_int_range(0, i32::try_from(n).unwrap_or(1))).unwrap_or(0);
        self.group_index.set(i);
        self.group_prompt.set_text(&format!("To check, type group {} of the key", i + 1));
        self.key.set_text(&key);
        *self.recovery.borrow_mut() = Some(key);
        switch(&self.wizard, RECOVERY);
    }

    fn check_group(&self) {
        self.recovery_next.set_sensitive(self.written.is_active() && !self.group.text().is_empty());
    }

    fn confirm_recovery(self: &Rc<Self>) {
        let ok = match self.recovery.borrow().as_ref() {
            Some(key) => {
                text::groups(key).get(self.group_index.get()).is_some_and(|g| text::same_group(&self.group.text(), g))
            }
            None => false,
        };
        if !ok {
            say(
                &self.recovery_error,
                &format!("That is not group {} of the key. Check what you wrote down.", self.group_index.get() + 1),
            );
            return;
        }
        *self.password.borrow_mut() = None;
        *self.recovery.borrow_mut() = None;
        self.key.set_text("");
        self.key_done.set(true);
        match self.ended.borrow_mut().take() {
            Some(how) => self.show_end(how),
            None => switch(&self.wizard, PROGRESS),
        }
    }

    fn cancel_job(self: &Rc<Self>) {
        let Some(job) = self.job.borrow().clone() else { return };
        self.cancel.set_sensitive(false);
        self.key_cancel.set_sensitive(false);
        self.phase.set_text(&text::phase("aborting"));
        self.spawn(|ui| async move {
            if let Err(e) = job.cancel().await {
                say(&ui.progress_error, &bus::error_text(&e));
                ui.cancel.set_sensitive(true);
                ui.key_cancel.set_sensitive(true);
            }
        });
    }

    /// Finds the caller's running job for the home (the window was closed, or the app
    /// restarted) and follows it on the progress page.
    fn find_job(self: &Rc<Self>) {
        self.spawn(|ui| async move {
            let r = async {
                let conn = ui.connection().await?;
                let messages = zbus::MessageStream::from(&conn);
                let found = bus::running_job(&conn, &ui.home).await?;
                Ok::<_, zbus::Error>((conn, messages, found))
            }
            .await;
            match r {
                Ok((conn, messages, Some(path))) => {
                    if ui.job.borrow().is_some() {
                        switch(&ui.main, "wizard");
                        ui.tabs.set_visible(false);
                        return;
                    }
                    ui.key_done.set(true);
                    *ui.ended.borrow_mut() = None;
                    ui.reset_progress();
                    ui.phase.set_text("Looking at the encryption under way");
                    switch(&ui.wizard, PROGRESS);
                    switch(&ui.main, "wizard");
                    ui.tabs.set_visible(false);
                    let _ = ui.follow(&conn, messages, path).await;
                }
                Ok((_, _, None)) => say(
                    &ui.overview_error,
                    "No encryption is running for your home now: the service is not working on it (it goes on at the next boot).",
                ),
                Err(e) => say(&ui.overview_error, &bus::error_text(&e)),
            }
        });
    }

    fn cancel_schedule(self: &Rc<Self>) {
        self.cancel_scheduled.set_sensitive(false);
        self.spawn(|ui| async move {
            let r = match ui.proxy().await {
                Ok(p) => p.cancel_scheduled(&ui.home).await,
                Err(e) => Err(e),
            };
            ui.cancel_scheduled.set_sensitive(true);
            match r {
                Ok(_) => ui.refresh(),
                Err(e) => say(&ui.overview_error, &bus::error_text(&e)),
            }
        });
    }

    fn check_recovery_key(self: &Rc<Self>) {
        let key = Zeroizing::new(self.recovery_check.text().to_string());
        if key.trim().is_empty() {
            say(&self.recovery_message, "Type the recovery key you wrote down.");
            return;
        }
        self.check_key.set_sensitive(false);
        say(&self.recovery_message, "Checking the recovery key");
        self.spawn(|ui| async move {
            let r = async {
                let p = ui.proxy().await?;
                let k = bus::secret_pipe(&key).map_err(|e| zbus::Error::InputOutput(e.into()))?;
                p.recovery_verify(&ui.home, Fd::from(&k)).await
            }
            .await;
            ui.check_key.set_sensitive(true);
            let said = match r {
                Ok(true) => "This recovery key opens your home.".to_owned(),
                Ok(false) => "This recovery key does not open your home. Check what you wrote down.".to_owned(),
                Err(e) => bus::error_text(&e),
            };
            say(&ui.recovery_message, &said);
        });
    }

    fn change_password(self: &Rc<Self>) {
        let old = Zeroizing::new(self.old.text().to_string());
        let new = Zeroizing::new(self.new1.text().to_string());
        if new.is_empty() || old.is_empty() {
            say(&self.manage_message, "Type the current password and the new one.");
            return;
        }
        if *new != *self.new2.text() {
            say(&self.manage_message, "The new passwords do not match. Type the same new password twice.");
            return;
        }
        let protector = self
            .status
            .borrow()
            .protectors
            .iter()
            .flatten()
            .find(|p| p.kind.as_deref() == Some("password") && p.uid == Some(self.uid))
            .and_then(|p| p.id.clone());
        let Some(protector) = protector else {
            say(
                &self.manage_message,
                "Your home has no password of yours to change: encrypt it first (Overview, “Encrypt my data”).",
            );
            return;
        };
        self.change.set_sensitive(false);
        say(&self.manage_message, "Changing the password");
        self.spawn(|ui| async move {
            let r = async {
                let p = ui.proxy().await?;
                let o = bus::secret_pipe(&old).map_err(|e| zbus::Error::InputOutput(e.into()))?;
                let n = bus::secret_pipe(&new).map_err(|e| zbus::Error::InputOutput(e.into()))?;
                p.change_secret(&protector, Fd::from(&o), Fd::from(&n)).await
            }
            .await;
            ui.change.set_sensitive(true);
            match r {
                Ok(()) => {
                    say(&ui.manage_message, "Password changed.");
                    for e in [&ui.old, &ui.new1, &ui.new2] {
                        e.set_text("");
                    }
                }
                Err(e) => say(&ui.manage_message, &bus::error_text(&e)),
            }
        });
    }
}

/// A handler that holds the shared state.
fn clone<W: 'static>(ui: &Rc<Ui>, f: impl Fn(&Rc<Ui>, &W) + 'static) -> impl Fn(&W) + 'static {
    let ui = ui.clone();
    move |w| f(&ui, w)
}
