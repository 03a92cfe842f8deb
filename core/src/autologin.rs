//! Automatic login onto an encrypted home (docs/pam.md, "Handhelds: automatic login"). An
//! autologin asks nothing, so the PAM module never gets a secret and the session would start on a
//! locked home. `dirseal-autologin.service` runs [`Dirseal::autologin_check`] before the display
//! manager starts; for each display manager whose configuration logs a user in automatically:
//!
//! 1. the home is encrypted and a protector of the user's that needs no typing (a TPM without PIN,
//!    a security key that needs only a touch) opens it: it is unlocked now, autologin proceeds;
//! 2. it is encrypted and nothing opens it without typing: autologin is turned off for this boot
//!    (and SDDM's on-screen keyboard selected), so the greeter asks and its login unlocks;
//! 3. it is not encrypted (or not dirseal's): autologin is left exactly as configured.
//!
//! Only files of dirseal's are written: a drop-in in the manager's configuration directory that
//! sorts last ([`DROPIN_NAME`]), and where a file read after it sets the autologin (SDDM's and
//! LightDM's main files, GDM, which has no drop-in directory) a modified copy in `/run`
//! bind-mounted over that file: it is gone at the next boot and the manager's file never changes.
//!
//! Every path is taken below a `root` (`/` on a running system) so the tests and image builders can
//! point it elsewhere; the decision itself ([`plan`]) is a pure function of the home's state and
//! the protectors it has.
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::ops::{Dirseal, OpsError, ProtectorSummary};
use crate::protector::ProtectorRecord;
use crate::ui::Ui;

/// The name of dirseal's drop-in in SDDM's and LightDM's configuration directories: it sorts after
/// the usual `NN-name.conf` files, so its settings win over theirs.
pub const DROPIN_NAME: &str = "zz-dirseal-autologin.conf";
/// The first line of every file dirseal writes for this: only files that start with it are ever
/// removed.
pub const MARK: &str = "# Written by dirseal-autologin.service (dirseal autologin check): autologin is off for this boot because the home is encrypted and nothing opens it without typing. Removed by the next check that finds no need for it.";
/// Where the runtime copies that are bind-mounted over a manager's file live (below the root).
pub const RUN_DIR: &str = "run/dirseal-autologin";

/// A display manager whose autologin dirseal knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Manager {
    /// SDDM (SteamOS, KDE).
    Sddm,
    /// LightDM.
    Lightdm,
    /// GDM (GNOME).
    Gdm,
}

/// A configuration file a manager reads, as the path on the running system.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Source {
    path: PathBuf,
    /// Read after dirseal's drop-in: its settings win over the drop-in's.
    after_dropin: bool,
}

impl Manager {
    /// Every manager, in the order they are reported.
    pub const ALL: [Manager; 3] = [Manager::Sddm, Manager::Lightdm, Manager::Gdm];

    /// Its name as in its package and unit.
    pub fn name(self) -> &'static str {
        match self {
            Manager::Sddm => "sddm",
            Manager::Lightdm => "lightdm",
            Manager::Gdm => "gdm",
        }
    }

    /// The directory of drop-ins read after the packaged ones, where dirseal's goes; GDM has none.
    pub fn dropin_dir(self) -> Option<&'static str> {
        match self {
            Manager::Sddm => Some("/etc/sddm.conf.d"),
            Manager::Lightdm => Some("/etc/lightdm/lightdm.conf.d"),
            Manager::Gdm => None,
        }
    }

    /// The path of dirseal's drop-in, if the manager has a drop-in directory.
    pub fn dropin(self) -> Option<PathBuf> {
        self.dropin_dir().map(|d| Path::new(d).join(DROPIN_NAME))
    }

    /// The files it reads, in its order (a later file's setting wins), that exist below `root`;
    /// dirseal's own drop-in is left out (it is what a check decides, not what was configured).
    fn sources(self, root: &Path) -> Vec<Source> {
        let (dirs, mains): (&[&str], &[&str]) = match self {
            // sddm.conf(5): the system directory, the local directory, then the main file.
            Manager::Sddm => (&["/usr/lib/sddm/sddm.conf.d", "/etc/sddm.conf.d"], &["/etc/sddm.conf"]),
            // lightdm: the packaged and local directories in XDG order, then the main file.
            Manager::Lightdm => (
                &[
                    "/usr/share/lightdm/lightdm.conf.d",
                    "/usr/local/share/lightdm/lightdm.conf.d",
                    "/etc/xdg/lightdm/lightdm.conf.d",
                    "/etc/lightdm/lightdm.conf.d",
                ],
                &["/etc/lightdm/lightdm.conf"],
            ),
            // GDM reads one file; its name differs between distributions (Debian, Ubuntu, Fedora).
            Manager::Gdm => (&[], &["/etc/gdm3/daemon.conf", "/etc/gdm3/custom.conf", "/etc/gdm/custom.conf"]),
        };
        let mut out = Vec::new();
        for dir in dirs {
            let ours = self.dropin_dir() == Some(*dir);
            let Ok(entries) = fs::read_dir(at(root, Path::new(dir))) else { continue };
            let mut names: Vec<String> = entries
                .filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.ends_with(".conf") && !n.starts_with('.'))
                .collect();
            names.sort();
            for n in names {
                if ours && n == DROPIN_NAME {
                    continue;
                }
                let after_dropin = ours && n.as_str() > DROPIN_NAME;
                out.push(Source { path: Path::new(dir).join(n), after_dropin });
            }
        }
        for m in mains {
            if at(root, Path::new(m)).is_file() {
                out.push(Source { path: PathBuf::from(m), after_dropin: true });
            }
        }
        out
    }

    /// What one file says of the autologin user: `Some("")` turns it off, `None` says nothing.
    fn user_in(self, text: &str) -> Option<String> {
        let mut user = None;
        let mut enable = None;
        for (section, key, value) in ini(text) {
            match (self, section.as_str(), key.as_str()) {
                (Manager::Sddm, "Autologin", "User") => user = Some(value),
                (Manager::Lightdm, "Seat:*" | "SeatDefaults" | "Seat:seat0", "autologin-user") => user = Some(value),
                (Manager::Gdm, "daemon", "AutomaticLogin") => user = Some(value),
                (Manager::Gdm, "daemon", "AutomaticLoginEnable") => {
                    enable = Some(matches!(value.to_ascii_lowercase().as_str(), "true" | "1" | "yes"))
                }
                _ => {}
            }
        }
        match self {
            // GDM logs in automatically only with both keys.
            Manager::Gdm => match enable {
                Some(true) => Some(user.unwrap_or_default()),
                Some(false) => Some(String::new()),
                None => None,
            },
            _ => user,
        }
    }

    /// `text` with this manager's autologin turned off, every other line as it was.
    fn turned_off(self, text: &str) -> String {
        let mut out = format!("{MARK}\n");
        let mut section = String::new();
        for line in text.lines() {
            let t = line.trim();
            if let Some(s) = t.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
                section = s.to_string();
            }
            let key = t.split_once('=').map(|(k, _)| k.trim());
            let replaced = match (self, section.as_str(), key) {
                (Manager::Sddm, "Autologin", Some("User")) => Some("User="),
                (Manager::Lightdm, "Seat:*" | "SeatDefaults" | "Seat:seat0", Some("autologin-user")) => {
                    Some("autologin-user=")
                }
                (Manager::Gdm, "daemon", Some("AutomaticLoginEnable")) => Some("AutomaticLoginEnable=false"),
                _ => None,
            };
            out.push_str(replaced.unwrap_or(line));
            out.push('\n');
        }
        out
    }

    /// dirseal's drop-in that turns autologin off (and selects SDDM's on-screen keyboard).
    fn dropin_text(self) -> String {
        match self {
            Manager::Sddm => format!("{MARK}\n[Autologin]\nUser=\n\n[General]\nInputMethod=qtvirtualkeyboard\n"),
            // The seat sections an autologin may be set in; an empty user is no autologin.
            Manager::Lightdm => {
                format!("{MARK}\n[Seat:*]\nautologin-user=\n\n[SeatDefaults]\nautologin-user=\n\n[Seat:seat0]\nautologin-user=\n")
            }
            Manager::Gdm => String::new(),
        }
    }
}

/// The `(section, key, value)` settings of an INI file (`#` and `;` comment lines).
fn ini(text: &str) -> Vec<(String, String, String)> {
    let mut section = String::new();
    let mut out = Vec::new();
    for line in text.lines() {
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') || t.starts_with(';') {
            continue;
        }
        if let Some(s) = t.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
            section = s.trim().to_string();
        } else if let Some((k, v)) = t.split_once('=') {
            out.push((section.clone(), k.trim().to_string(), v.trim().to_string()));
        }
    }
    out
}

/// `path` (absolute on the running system) below `root`.
pub fn at(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

/// An autologin a display manager is configured with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Configured {
    /// The display manager.
    pub manager: Manager,
    /// The user it logs in.
    pub user: String,
    /// The file whose setting is in effect (the last that sets it).
    pub file: PathBuf,
    /// dirseal's drop-in that turns it off, where the manager's drop-in directory exists.
    pub dropin: Option<PathBuf>,
    /// Files read after dirseal's drop-in that set the autologin: a drop-in cannot turn them off,
    /// so a runtime copy is mounted over each (all of GDM's: it has no drop-in directory).
    pub overlays: Vec<PathBuf>,
}

/// The autologin `manager` is configured with below `root`, if any (dirseal's drop-in and runtime
/// copies left out: they are the check's doing, not the configuration).
pub fn configured(root: &Path, manager: Manager) -> Result<Option<Configured>, AutologinError> {
    // dirseal never creates a manager's directory (it would outlive an uninstall): without it,
    // every file that sets the autologin gets a runtime copy instead.
    let dropin = manager.dropin().filter(|p| at(root, p).parent().is_some_and(Path::is_dir));
    let mut found: Option<(String, PathBuf)> = None;
    let mut overlays = Vec::new();
    for src in manager.sources(root) {
        let text = read_original(root, &src.path)?;
        if let Some(user) = manager.user_in(&text) {
            if src.after_dropin || dropin.is_none() {
                overlays.push(src.path.clone());
            }
            found = Some((user, src.path));
        }
    }
    Ok(found.filter(|(u, _)| !u.is_empty()).map(|(user, file)| Configured { manager, user, file, dropin, overlays }))
}

/// A manager's file as configured: under a runtime copy of dirseal's, the original's text that
/// was saved next to the copy when it was made (reading changes nothing, so `status` may).
fn read_original(root: &Path, path: &Path) -> Result<String, AutologinError> {
    let file = if overlaid(root, path) { original_path(root, path) } else { at(root, path) };
    fs::read_to_string(&file).map_err(|e| AutologinError::io(&file, e))
}

/// The home's state as the decision needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HomeState {
    /// Not encrypted, or not by dirseal (no policy record): none of dirseal's business.
    Plain,
    /// Encrypted by dirseal, key not loaded.
    Locked,
    /// Encrypted by dirseal, key loaded.
    Unlocked,
}

/// What a check does for one autologin.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Plan {
    /// Case 3: not encrypted; autologin stays as configured.
    AsConfigured,
    /// Case 1 with nothing to do: the home is open already.
    AlreadyOpen,
    /// Case 1: open it with the protectors that need no typing; if none does, case 2.
    OpenWithoutTyping,
    /// Case 2: autologin off, the greeter asks.
    Greeter,
}

impl Plan {
    /// The case of docs/pam.md: 1 (autologin onto an opened home), 2 (the greeter), 3 (untouched).
    pub fn case(self) -> u8 {
        match self {
            Plan::AlreadyOpen | Plan::OpenWithoutTyping => 1,
            Plan::Greeter => 2,
            Plan::AsConfigured => 3,
        }
    }
}

/// The decision: from the home's state and how many of the user's own protectors of it need no
/// typing.
pub fn plan(home: HomeState, no_typing: usize) -> Plan {
    match home {
        HomeState::Plain => Plan::AsConfigured,
        HomeState::Unlocked => Plan::AlreadyOpen,
        HomeState::Locked if no_typing > 0 => Plan::OpenWithoutTyping,
        HomeState::Locked => Plan::Greeter,
    }
}

/// Whether a protector opens without anything typed: a TPM without PIN, a key that needs a touch.
pub fn needs_no_typing(rec: &ProtectorRecord) -> bool {
    rec.kind.ask().secret.is_none()
}

/// What `status` says of an autologin.
#[derive(Clone, Debug, Serialize)]
pub struct Status {
    /// The configured autologin.
    #[serde(flatten)]
    pub configured: Configured,
    /// The user's home (from the password database); `None`: no such user.
    pub home: Option<PathBuf>,
    /// The home's state now.
    pub state: HomeState,
    /// The user's own protectors of the home that need no typing.
    pub no_typing: Vec<ProtectorSummary>,
    /// What the next boot does: 1, 2 or 3 (docs/pam.md).
    pub next_boot: u8,
    /// The same in words.
    pub next_boot_text: String,
    /// What the check of this boot did (dirseal's drop-in or runtime copies are in place).
    pub greeter_now: bool,
}

/// What a check did for one autologin.
#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    /// The configured autologin.
    #[serde(flatten)]
    pub configured: Configured,
    /// The decision before anything was tried.
    pub plan: Plan,
    /// The case that happens: 1, 2 or 3.
    pub case: u8,
    /// The protector that opened the home (case 1 with something done).
    pub opened_with: Option<ProtectorSummary>,
    /// Why the protectors that need no typing did not open it (case 2 after a failed try).
    pub problems: Vec<String>,
    /// The files dirseal wrote or mounted for it.
    pub written: Vec<PathBuf>,
}

/// Why a check could not finish.
#[derive(Debug, thiserror::Error)]
pub enum AutologinError {
    /// A manager's file, dirseal's drop-in or a runtime copy could not be read, written or mounted.
    #[error("{path}: {source}; the display manager's files are unchanged; fix this and run `dirseal autologin check` again (or restart dirseal-autologin.service)")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The home's state or its protectors could not be read.
    #[error(transparent)]
    Ops(#[from] OpsError),
}

impl AutologinError {
    fn io(path: &Path, source: std::io::Error) -> AutologinError {
        AutologinError::Io { path: path.to_path_buf(), source }
    }
}

/// Whether `path` (on the running system) has dirseal's runtime copy mounted over it: the file
/// seen there is the copy itself (same inode).
fn overlaid(root: &Path, path: &Path) -> bool {
    let (Ok(seen), Ok(copy)) = (fs::metadata(at(root, path)), fs::metadata(copy_path(root, path))) else {
        return false;
    };
    seen.dev() == copy.dev() && seen.ino() == copy.ino()
}

/// The runtime copy made for `path`: its path with `/` spelled `%2F` (and `%` as `%25`).
fn copy_path(root: &Path, path: &Path) -> PathBuf {
    let flat = path.to_string_lossy().replace('%', "%25").replace('/', "%2F");
    at(root, Path::new(RUN_DIR)).join(flat)
}

/// The original's text, saved next to its runtime copy.
fn original_path(root: &Path, path: &Path) -> PathBuf {
    let mut p = copy_path(root, path).into_os_string();
    p.push(ORIG);
    PathBuf::from(p)
}

const ORIG: &str = ".orig";

fn unmount(target: &Path) -> Result<(), AutologinError> {
    nix::mount::umount2(target, nix::mount::MntFlags::MNT_DETACH)
        .map_err(|e| AutologinError::io(target, std::io::Error::from_raw_os_error(e as i32)))
}

/// Lifts every runtime copy dirseal mounted below `root` and removes the copies.
fn lift_overlays(root: &Path) -> Result<(), AutologinError> {
    let dir = at(root, Path::new(RUN_DIR));
    let Ok(entries) = fs::read_dir(&dir) else { return Ok(()) };
    for e in entries.filter_map(|e| e.ok()) {
        let name = e.file_name().to_string_lossy().into_owned();
        let path = PathBuf::from(name.replace("%2F", "/").replace("%25", "%"));
        if !name.ends_with(ORIG) && overlaid(root, &path) {
            unmount(&at(root, &path))?;
        }
        fs::remove_file(e.path()).map_err(|err| AutologinError::io(&e.path(), err))?;
    }
    Ok(())
}

/// Removes dirseal's drop-in of `manager`, if there is one and it is dirseal's (starts with [`MARK`]).
fn remove_dropin(root: &Path, manager: Manager) -> Result<Option<PathBuf>, AutologinError> {
    let Some(p) = manager.dropin() else { return Ok(None) };
    let file = at(root, &p);
    match fs::read_to_string(&file) {
        Ok(t) if t.starts_with(MARK) => {
            fs::remove_file(&file).map_err(|e| AutologinError::io(&file, e))?;
            Ok(Some(p))
        }
        _ => Ok(None),
    }
}

/// Whether dirseal's drop-in of `manager` is in place, or a runtime copy over one of its files.
pub fn greeter_forced(root: &Path, c: &Configured) -> bool {
    let dropin =
        c.manager.dropin().is_some_and(|p| fs::read_to_string(at(root, &p)).is_ok_and(|t| t.starts_with(MARK)));
    dropin || c.overlays.iter().any(|o| overlaid(root, o))
}

/// Turns `c`'s autologin off for this boot: dirseal's drop-in, and a runtime copy over each file a
/// drop-in cannot override. Returns what it wrote.
fn force_greeter(root: &Path, c: &Configured) -> Result<Vec<PathBuf>, AutologinError> {
    let mut written = Vec::new();
    if let Some(p) = &c.dropin {
        let file = at(root, p);
        match fs::read_to_string(&file) {
            // Someone else's file of that name is never overwritten.
            Ok(t) if !t.starts_with(MARK) => {
                return Err(AutologinError::io(
                    &file,
                    std::io::Error::new(std::io::ErrorKind::AlreadyExists, "a file dirseal did not write has its name"),
                ))
            }
            _ => {}
        }
        crate::securefile::write_atomic(&file, c.manager.dropin_text().as_bytes())
            .map_err(|e| AutologinError::io(&file, std::io::Error::other(e.to_string())))?;
        set_mode(&file, 0o644)?;
        written.push(p.clone());
    }
    for o in &c.overlays {
        let target = at(root, o);
        let text = fs::read_to_string(&target).map_err(|e| AutologinError::io(&target, e))?;
        let copy = copy_path(root, o);
        let dir = at(root, Path::new(RUN_DIR));
        fs::create_dir_all(&dir).map_err(|e| AutologinError::io(&dir, e))?;
        let orig = original_path(root, o);
        fs::write(&orig, &text).map_err(|e| AutologinError::io(&orig, e))?;
        fs::write(&copy, c.manager.turned_off(&text)).map_err(|e| AutologinError::io(&copy, e))?;
        set_mode(&copy, 0o644)?;
        nix::mount::mount(Some(&copy), &target, None::<&str>, nix::mount::MsFlags::MS_BIND, None::<&str>)
            .map_err(|e| AutologinError::io(&target, std::io::Error::from_raw_os_error(e as i32)))?;
        written.push(o.clone());
    }
    Ok(written)
}

fn set_mode(path: &Path, mode: u32) -> Result<(), AutologinError> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(|e| AutologinError::io(path, e))
}

/// Removes everything dirseal wrote for autologins below `root`: runtime copies and drop-ins
/// (uninstall, purge). Returns the drop-ins removed.
pub fn clear(root: &Path) -> Result<Vec<PathBuf>, AutologinError> {
    lift_overlays(root)?;
    let mut removed = Vec::new();
    for m in Manager::ALL {
        removed.extend(remove_dropin(root, m)?);
    }
    Ok(removed)
}

/// An autologin user's home as the decision sees it.
struct UserHome {
    home: PathBuf,
    uid: u32,
    state: HomeState,
    /// The user's own protectors of it that need no typing, in the login order.
    no_typing: Vec<ProtectorRecord>,
}

impl Dirseal {
    /// The home of `user` (`None`: no such user), its state, and the user's protectors of it that
    /// need no typing.
    fn autologin_home(&self, user: &str) -> Result<Option<UserHome>, OpsError> {
        let Ok((uid, home)) = crate::ops::lookup_user(user) else { return Ok(None) };
        let plain = |home| Ok(Some(UserHome { home, uid, state: HomeState::Plain, no_typing: Vec::new() }));
        // A home that does not exist (yet) is no encrypted home.
        if !home.is_dir() {
            return plain(home);
        }
        let Some(policy) = self.managed_policy(&home)? else { return plain(home) };
        let state = if self.is_unlocked(&home)? { HomeState::Unlocked } else { HomeState::Locked };
        let no_typing = self.login_protectors(&policy, uid).into_iter().filter(needs_no_typing).collect();
        Ok(Some(UserHome { home, uid, state, no_typing }))
    }

    /// Every configured autologin below `root` and what the next boot does with it.
    pub fn autologin_status(&self, root: &Path) -> Result<Vec<Status>, AutologinError> {
        let mut out = Vec::new();
        for m in Manager::ALL {
            let Some(c) = configured(root, m)? else { continue };
            let (home, state, quiet) = match self.autologin_home(&c.user)? {
                Some(h) => (Some(h.home), h.state, h.no_typing),
                None => (None, HomeState::Plain, Vec::new()),
            };
            // At the next boot every key is gone: an encrypted home is locked then.
            let next = plan(if state == HomeState::Plain { state } else { HomeState::Locked }, quiet.len());
            let next_boot_text = match next {
                Plan::Greeter => format!(
                    "2: nothing opens {}'s encrypted home without typing, so the greeter is shown (autologin off for that boot) and the login there unlocks it",
                    c.user
                ),
                Plan::OpenWithoutTyping | Plan::AlreadyOpen => format!(
                    "1: protector {} opens {}'s encrypted home without typing before {} starts, then autologin proceeds (if it cannot, 2: the greeter)",
                    quiet.iter().map(|r| r.name.as_str()).collect::<Vec<_>>().join(", "),
                    c.user,
                    m.name()
                ),
                Plan::AsConfigured => format!("3: {}'s home is not encrypted by dirseal; autologin as configured", c.user),
            };
            out.push(Status {
                greeter_now: greeter_forced(root, &c),
                configured: c,
                home,
                state,
                no_typing: quiet.iter().map(ProtectorSummary::of).collect(),
                next_boot: next.case(),
                next_boot_text,
            });
        }
        Ok(out)
    }

    /// The check run before the display managers start (`dirseal autologin check`): decides each
    /// configured autologin's case, unlocks the home (1), turns autologin off for this boot (2), or
    /// removes whatever an earlier check wrote (3, and managers without autologin).
    pub fn autologin_check(&self, root: &Path, ui: &mut dyn Ui) -> Result<Vec<Outcome>, AutologinError> {
        // What an earlier check mounted hides the configuration: lift it first.
        lift_overlays(root)?;
        let mut out = Vec::new();
        for m in Manager::ALL {
            let Some(c) = configured(root, m)? else {
                remove_dropin(root, m)?;
                continue;
            };
            let found = self.autologin_home(&c.user)?;
            let plan = found.as_ref().map_or(Plan::AsConfigured, |h| plan(h.state, h.no_typing.len()));
            let mut case = plan.case();
            let mut opened_with = None;
            let mut problems = Vec::new();
            if let (Plan::OpenWithoutTyping, Some(UserHome { home, uid, .. })) = (plan, &found) {
                let policy = self.policy_of(home)?;
                let login = self.login_where(&policy, *uid, ui, needs_no_typing)?;
                problems = login.problems.iter().map(|(id, e)| format!("protector {id}: {e}")).collect();
                match login.opened {
                    Some((rec, master)) => {
                        self.add_key(home, &master)?;
                        opened_with = Some(ProtectorSummary::of(&rec));
                    }
                    None => {
                        if problems.is_empty() {
                            problems
                                .push("no protector that needs no typing could open it (no TPM or key present)".into());
                        }
                        case = 2;
                    }
                }
            }
            let written = if case == 2 {
                force_greeter(root, &c)?
            } else {
                remove_dropin(root, m)?;
                Vec::new()
            };
            out.push(Outcome { configured: c, plan, case, opened_with, problems, written });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(root: &Path, path: &str, text: &str) {
        let f = at(root, Path::new(path));
        fs::create_dir_all(f.parent().expect("has a parent")).expect("mkdir");
        fs::write(f, text).expect("write");
    }

    #[test]
    fn the_decision() {
        assert_eq!(plan(HomeState::Plain, 0), Plan::AsConfigured);
        assert_eq!(plan(HomeState::Plain, 2), Plan::AsConfigured);
        assert_eq!(plan(HomeState::Unlocked, 0), Plan::AlreadyOpen);
        assert_eq!(plan(HomeState::Locked, 1), Plan::OpenWithoutTyping);
        assert_eq!(plan(HomeState::Locked, 0), Plan::Greeter);
        assert_eq!([Plan::OpenWithoutTyping, Plan::Greeter, Plan::AsConfigured].map(Plan::case), [1, 2, 3]);
    }

    #[test]
    fn sddm_conf_d_is_overridden_by_a_dropin_the_main_file_needs_a_copy() {
        let root = tempfile::tempdir().expect("tempdir");
        let r = root.path();
        assert_eq!(configured(r, Manager::Sddm).expect("read"), None);
        put(r, "/usr/lib/sddm/sddm.conf.d/default.conf", "[Autologin]\nUser=\nSession=\n");
        assert_eq!(configured(r, Manager::Sddm).expect("read"), None, "an empty user is no autologin");
        put(
            r,
            "/etc/sddm.conf.d/steamos.conf",
            "[General]\nX=1\n# User=no\n[Autologin]\nUser = deck\nSession=gamescope\n",
        );
        let c = configured(r, Manager::Sddm).expect("read").expect("configured");
        assert_eq!((c.user.as_str(), c.file.as_path()), ("deck", Path::new("/etc/sddm.conf.d/steamos.conf")));
        assert!(c.overlays.is_empty(), "{c:?}");
        // dirseal's own drop-in is not configuration.
        put(r, "/etc/sddm.conf.d/zz-dirseal-autologin.conf", &Manager::Sddm.dropin_text());
        assert_eq!(configured(r, Manager::Sddm).expect("read").expect("configured").user, "deck");
        // A file sorting after the drop-in, and the main file, win over it.
        put(r, "/etc/sddm.conf.d/zzz.conf", "[Autologin]\nUser=kim\n");
        put(r, "/etc/sddm.conf", "[Autologin]\nUser=ana\n");
        let c = configured(r, Manager::Sddm).expect("read").expect("configured");
        assert_eq!((c.user.as_str(), c.file.as_path()), ("ana", Path::new("/etc/sddm.conf")));
        assert_eq!(c.overlays, [PathBuf::from("/etc/sddm.conf.d/zzz.conf"), PathBuf::from("/etc/sddm.conf")]);
    }

    #[test]
    fn lightdm_sections_and_gdm_enable() {
        let root = tempfile::tempdir().expect("tempdir");
        let r = root.path();
        fs::create_dir_all(at(r, Path::new("/etc/lightdm/lightdm.conf.d"))).expect("mkdir");
        put(
            r,
            "/etc/lightdm/lightdm.conf",
            "[LightDM]\n[Seat:*]\n#autologin-user=\n[XDMCPServer]\nautologin-user=no\n",
        );
        assert_eq!(configured(r, Manager::Lightdm).expect("read"), None, "other sections say nothing");
        put(r, "/usr/share/lightdm/lightdm.conf.d/01-debian.conf", "[Seat:*]\nautologin-user=kim\n");
        let c = configured(r, Manager::Lightdm).expect("read").expect("configured");
        assert_eq!((c.user.as_str(), c.overlays.len()), ("kim", 0));
        put(r, "/etc/lightdm/lightdm.conf", "[SeatDefaults]\nautologin-user=ana\nautologin-user-timeout=0\n");
        let c = configured(r, Manager::Lightdm).expect("read").expect("configured");
        assert_eq!((c.user.as_str(), c.overlays.len()), ("ana", 1));
        let off = Manager::Lightdm.turned_off("[SeatDefaults]\nautologin-user=ana\nautologin-user-timeout=0\n");
        assert_eq!(Manager::Lightdm.user_in(&off), Some(String::new()), "{off}");
        assert!(off.contains("autologin-user-timeout=0"), "{off}");

        put(r, "/etc/gdm3/daemon.conf", "[daemon]\nAutomaticLogin=kim\n");
        assert_eq!(configured(r, Manager::Gdm).expect("read"), None, "GDM needs AutomaticLoginEnable");
        put(r, "/etc/gdm3/daemon.conf", "[daemon]\nAutomaticLoginEnable = True\nAutomaticLogin=kim\n[security]\n");
        let c = configured(r, Manager::Gdm).expect("read").expect("configured");
        assert_eq!(
            (c.user.as_str(), c.overlays.as_slice()),
            ("kim", [PathBuf::from("/etc/gdm3/daemon.conf")].as_slice())
        );
        let off =
            Manager::Gdm.turned_off(&fs::read_to_string(at(r, Path::new("/etc/gdm3/daemon.conf"))).expect("read"));
        assert_eq!(Manager::Gdm.user_in(&off), Some(String::new()), "{off}");
    }

    #[test]
    fn a_foreign_file_with_the_dropin_name_is_never_overwritten_or_removed() {
        let root = tempfile::tempdir().expect("tempdir");
        let r = root.path();
        put(r, "/etc/sddm.conf.d/autologin.conf", "[Autologin]\nUser=deck\n");
        put(r, "/etc/sddm.conf.d/zz-dirseal-autologin.conf", "[General]\nmine=1\n");
        let c = configured(r, Manager::Sddm).expect("read").expect("configured");
        assert!(matches!(force_greeter(r, &c), Err(AutologinError::Io { .. })));
        assert_eq!(clear(r).expect("clear"), Vec::<PathBuf>::new());
        let left = fs::read_to_string(at(r, Path::new("/etc/sddm.conf.d/zz-dirseal-autologin.conf"))).expect("kept");
        assert_eq!(left, "[General]\nmine=1\n");
    }
}
