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
//! It fails closed: every automatic login is turned off first ([`turn_off`]) and turned back on
//! only for a manager whose every user was decided 1 or 3; `dirseal-autologin.service` runs
//! [`turn_off`] again (`dirseal autologin off`) when the check did not succeed.
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

    /// Whether `(section, key)` is one of the settings that make this manager log someone in
    /// without asking (or again after a logout). LightDM's `autologin-guest` is not: a guest
    /// account is made fresh for the session, it has no home of dirseal's (docs/pam.md).
    fn autologin_key(self, section: &str, key: &str) -> bool {
        match self {
            Manager::Sddm => section == "Autologin" && matches!(key, "User" | "Relogin"),
            Manager::Lightdm => seat_section(section) && matches!(key, "autologin-user" | "autologin-user-timeout"),
            Manager::Gdm => {
                section == "daemon"
                    && matches!(key, "AutomaticLoginEnable" | "AutomaticLogin" | "TimedLoginEnable" | "TimedLogin")
            }
        }
    }

    /// Adds `file`'s autologin settings (`text`) to `set`, over earlier ones; whether it has any.
    fn settings(self, text: &str, file: &Path, set: &mut Settings) -> bool {
        let mut any = false;
        for (section, key, value) in ini(text) {
            if self.autologin_key(&section, &key) {
                any = true;
                let section = if section == "SeatDefaults" { "Seat:*".to_string() } else { section };
                set.insert((section, key), (value, file.to_path_buf()));
            }
        }
        any
    }

    /// The users this manager logs in without asking, from its settings in effect (the last file
    /// that sets a key wins): `(user, how, the file that names the user)`, each user once.
    fn logins(self, set: &Settings) -> Vec<(String, Kind, PathBuf)> {
        let get = |s: &str, k: &str| set.get(&(s.to_string(), k.to_string()));
        let on = |s: &str, k: &str| get(s, k).is_some_and(|(v, _)| truthy(v));
        let mut out: Vec<(String, Kind, PathBuf)> = Vec::new();
        let mut push = |user: Option<&(String, PathBuf)>, kind: Kind| {
            if let Some((u, f)) = user.filter(|(u, _)| !u.is_empty()) {
                if !out.iter().any(|(v, ..)| v == u) {
                    out.push((u.clone(), kind, f.clone()));
                }
            }
        };
        match self {
            Manager::Sddm => push(get("Autologin", "User"), Kind::Automatic),
            // GDM logs in automatically at boot with both Automatic keys, and from the greeter after
            // TimedLoginDelay with both Timed keys (the greeter shows, then logs in by itself).
            Manager::Gdm => {
                if on("daemon", "AutomaticLoginEnable") {
                    push(get("daemon", "AutomaticLogin"), Kind::Automatic);
                }
                if on("daemon", "TimedLoginEnable") {
                    push(get("daemon", "TimedLogin"), Kind::Timed);
                }
            }
            // LightDM: `[Seat:*]` (`[SeatDefaults]` is its old name) for every seat, a `[Seat:NAME]`
            // overrides it for its seats; a timeout above 0 is a timed login.
            Manager::Lightdm => {
                let mut seats = vec!["Seat:*".to_string()];
                seats.extend(set.keys().map(|(s, _)| s.clone()).filter(|s| s != "Seat:*"));
                seats.dedup();
                for seat in &seats {
                    let key = |k: &str| get(seat, k).or_else(|| get("Seat:*", k));
                    let timed =
                        key("autologin-user-timeout").is_some_and(|(v, _)| v.parse::<u64>().is_ok_and(|t| t > 0));
                    push(key("autologin-user"), if timed { Kind::Timed } else { Kind::Automatic });
                }
            }
        }
        out
    }

    /// `text` with this manager's automatic logins turned off (or, [`Override::NoRelogin`], only
    /// SDDM's relogin after a logout), every other line as it was.
    fn turned_off(self, text: &str, how: Override) -> String {
        let mut out = format!("{MARK}\n");
        let mut section = String::new();
        let off = how == Override::Off;
        for line in text.lines() {
            let t = line.trim();
            if let Some(s) = t.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
                section = s.trim().to_string();
            }
            let key = t.split_once('=').map(|(k, _)| k.trim());
            let replaced = match (self, section.as_str(), key) {
                (Manager::Sddm, "Autologin", Some("User")) if off => Some("User="),
                (Manager::Sddm, "Autologin", Some("Relogin")) => Some("Relogin=false"),
                (Manager::Lightdm, s, Some("autologin-user")) if off && seat_section(s) => Some("autologin-user="),
                (Manager::Gdm, "daemon", Some("AutomaticLoginEnable")) if off => Some("AutomaticLoginEnable=false"),
                (Manager::Gdm, "daemon", Some("TimedLoginEnable")) if off => Some("TimedLoginEnable=false"),
                _ => None,
            };
            out.push_str(replaced.unwrap_or(line));
            out.push('\n');
        }
        out
    }

    /// dirseal's drop-in: automatic logins off (and SDDM's on-screen keyboard selected), or only
    /// SDDM's relogin off. `seats`: the LightDM seat sections the configuration names.
    fn dropin_text(self, how: Override, seats: &[String]) -> String {
        match (self, how) {
            (Manager::Sddm, Override::Off) => {
                format!("{MARK}\n[Autologin]\nUser=\nRelogin=false\n\n[General]\nInputMethod=qtvirtualkeyboard\n")
            }
            (Manager::Sddm, Override::NoRelogin) => format!(
                "{MARK}\n# Here only the relogin after a logout is off: the last logout locks the home, a relogin would start a session on it locked.\n[Autologin]\nRelogin=false\n"
            ),
            // Every seat section an autologin may be set in; an empty user is no autologin.
            (Manager::Lightdm, _) => {
                let mut text = format!("{MARK}\n");
                let mut all: Vec<&str> = vec!["Seat:*", "SeatDefaults", "Seat:seat0"];
                all.extend(seats.iter().map(String::as_str).filter(|s| *s != "Seat:*"));
                all.dedup();
                for s in all {
                    text.push_str(&format!("[{s}]\nautologin-user=\n\n"));
                }
                text
            }
            _ => String::new(),
        }
    }
}

/// Which of a manager's settings dirseal writes for this boot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Override {
    /// Every automatic login off: the greeter asks.
    Off,
    /// Autologin as configured but SDDM's `Relogin` off (case 1: a logout locks the home).
    NoRelogin,
}

/// A manager's autologin settings in effect: `(section, key)` → `(value, the file that set it)`.
type Settings = std::collections::BTreeMap<(String, String), (String, PathBuf)>;

/// A LightDM seat section (`[SeatDefaults]` is read as `[Seat:*]`).
fn seat_section(section: &str) -> bool {
    section == "SeatDefaults" || section.starts_with("Seat:")
}

/// A boolean as GLib's key files, Qt's settings and LightDM read it.
fn truthy(value: &str) -> bool {
    matches!(value.to_ascii_lowercase().as_str(), "true" | "1" | "yes")
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

/// How a display manager logs a user in without asking.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// At once, when it starts (GDM's AutomaticLogin, SDDM's User, LightDM's without timeout).
    Automatic,
    /// After the greeter has been shown for a while (GDM's TimedLogin, LightDM's
    /// `autologin-user-timeout`): as automatic, as far as a locked home is concerned.
    Timed,
}

/// An autologin a display manager is configured with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Configured {
    /// The display manager.
    pub manager: Manager,
    /// The user it logs in.
    pub user: String,
    /// At once or after a delay.
    pub kind: Kind,
    /// SDDM logs the user in again after each logout (`[Autologin] Relogin=true`).
    pub relogin: bool,
    /// The file whose setting is in effect (the last that sets it).
    pub file: PathBuf,
    /// dirseal's drop-in that turns it off, where the manager's drop-in directory exists.
    pub dropin: Option<PathBuf>,
    /// Files read after dirseal's drop-in that set the autologin: a drop-in cannot turn them off,
    /// so a runtime copy is mounted over each (all of GDM's: it has no drop-in directory).
    pub overlays: Vec<PathBuf>,
    /// LightDM's seat sections that set a user (the drop-in empties each).
    #[serde(skip)]
    seats: Vec<String>,
}

/// The autologins `manager` is configured with below `root`, one per user it logs in without
/// asking (dirseal's drop-in and runtime copies left out: they are the check's doing, not the
/// configuration).
pub fn configured(root: &Path, manager: Manager) -> Result<Vec<Configured>, AutologinError> {
    // dirseal never creates a manager's directory (it would outlive an uninstall): without it,
    // every file that sets the autologin gets a runtime copy instead.
    let dropin = manager.dropin().filter(|p| at(root, p).parent().is_some_and(Path::is_dir));
    let mut set = Settings::new();
    let mut overlays = Vec::new();
    for src in manager.sources(root) {
        let text = read_original(root, &src.path)?;
        if manager.settings(&text, &src.path, &mut set) && (src.after_dropin || dropin.is_none()) {
            overlays.push(src.path.clone());
        }
    }
    let relogin = manager == Manager::Sddm
        && set.get(&("Autologin".to_string(), "Relogin".to_string())).is_some_and(|(v, _)| truthy(v));
    let seats: Vec<String> = set.keys().filter(|(_, k)| k == "autologin-user").map(|(s, _)| s.clone()).collect();
    Ok(manager
        .logins(&set)
        .into_iter()
        .map(|(user, kind, file)| Configured {
            manager,
            user,
            kind,
            relogin,
            file,
            dropin: dropin.clone(),
            overlays: overlays.clone(),
            seats: seats.clone(),
        })
        .collect())
}

/// A manager's file as configured: under a runtime copy of dirseal's, the original's text that
/// was saved next to the copy when it was made (reading changes nothing, so `status` may).
fn read_original(root: &Path, path: &Path) -> Result<String, AutologinError> {
    let file = if overlaid(root, path) { original_path(root, path) } else { at(root, path) };
    read_text(&file)
}

/// A manager's file as text: a byte that is not UTF-8 (a Latin-1 comment) must not stop the check
/// (autologin would stay on); it becomes U+FFFD, in the runtime copy too.
fn read_text(file: &Path) -> Result<String, AutologinError> {
    let bytes = fs::read(file).map_err(|e| AutologinError::io(file, e))?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
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
    #[error("{path}: {source}; fix this and run `dirseal autologin check` again (or restart dirseal-autologin.service); until then autologin stays off where dirseal could turn it off, and dirseal-autologin.service keeps the display manager from starting where it could not")]
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

/// Whether this boot's automatic logins of `c`'s manager are off: dirseal's drop-in turning them
/// off, or a runtime copy over one of its files that does.
pub fn greeter_forced(root: &Path, c: &Configured) -> bool {
    let off = c.manager.dropin_text(Override::Off, &c.seats);
    let dropin = c.manager.dropin().is_some_and(|p| fs::read_to_string(at(root, &p)).is_ok_and(|t| t == off));
    let copy_off = |o: &PathBuf| {
        overlaid(root, o)
            && fs::read_to_string(copy_path(root, o)).is_ok_and(|t| {
                let mut set = Settings::new();
                c.manager.settings(&t, o, &mut set);
                c.manager.logins(&set).is_empty()
            })
    };
    dropin || c.overlays.iter().any(copy_off)
}

/// Writes `how` for `c`'s manager for this boot: dirseal's drop-in, and a runtime copy over each
/// file a drop-in cannot override (a copy already mounted is rewritten in place: the file is never
/// seen as configured in between). Returns what it wrote.
fn apply(root: &Path, c: &Configured, how: Override) -> Result<Vec<PathBuf>, AutologinError> {
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
        crate::securefile::write_atomic(&file, c.manager.dropin_text(how, &c.seats).as_bytes())
            .map_err(|e| AutologinError::io(&file, std::io::Error::other(e.to_string())))?;
        set_mode(&file, 0o644)?;
        written.push(p.clone());
    }
    for o in &c.overlays {
        let target = at(root, o);
        let copy = copy_path(root, o);
        let orig = original_path(root, o);
        if overlaid(root, o) {
            let text = read_text(&orig)?;
            fs::write(&copy, c.manager.turned_off(&text, how)).map_err(|e| AutologinError::io(&copy, e))?;
        } else {
            let text = read_text(&target)?;
            let dir = at(root, Path::new(RUN_DIR));
            fs::create_dir_all(&dir).map_err(|e| AutologinError::io(&dir, e))?;
            fs::write(&orig, &text).map_err(|e| AutologinError::io(&orig, e))?;
            fs::write(&copy, c.manager.turned_off(&text, how)).map_err(|e| AutologinError::io(&copy, e))?;
            set_mode(&copy, 0o644)?;
            nix::mount::mount(Some(&copy), &target, None::<&str>, nix::mount::MsFlags::MS_BIND, None::<&str>)
                .map_err(|e| AutologinError::io(&target, std::io::Error::from_raw_os_error(e as i32)))?;
        }
        written.push(o.clone());
    }
    Ok(written)
}

/// Takes back what [`apply`] wrote for `c`'s manager: its runtime copies and its drop-in.
fn lift(root: &Path, c: &Configured) -> Result<(), AutologinError> {
    for o in &c.overlays {
        if overlaid(root, o) {
            unmount(&at(root, o))?;
        }
        for f in [copy_path(root, o), original_path(root, o)] {
            match fs::remove_file(&f) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(AutologinError::io(&f, e)),
                _ => {}
            }
        }
    }
    remove_dropin(root, c.manager)?;
    Ok(())
}

/// One manager's autologins (each user it logs in) and the files written to turn them off.
pub type TurnedOff = (Vec<Configured>, Vec<PathBuf>);

/// Turns every automatic login below `root` off for this boot, whoever it logs in, whatever the
/// home (`dirseal autologin off`): the first step of every check, and what
/// dirseal-autologin.service runs when the check failed, was killed or timed out. Needs no
/// keystore. Each manager is tried even when another fails; the first error is returned.
/// Returns each manager's autologins and what was written for them.
pub fn turn_off(root: &Path) -> Result<Vec<TurnedOff>, AutologinError> {
    let mut out = Vec::new();
    let mut failed = None;
    for m in Manager::ALL {
        let done = configured(root, m).and_then(|list| match list.first() {
            // Nothing to turn off: an earlier check's drop-in goes.
            None => remove_dropin(root, m).map(|_| None),
            Some(c) => apply(root, c, Override::Off).map(|w| Some((list, w))),
        });
        match done {
            Ok(Some(x)) => out.push(x),
            Ok(None) => {}
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
    }
    failed.map_or(Ok(out), Err)
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
            for c in configured(root, m)? {
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
                        "1: protector {} opens {}'s encrypted home without typing before {} starts, then autologin proceeds{} (if it cannot, 2: the greeter)",
                        quiet.iter().map(|r| r.name.as_str()).collect::<Vec<_>>().join(", "),
                        c.user,
                        m.name(),
                        if c.relogin { ", without the relogin after a logout (a logout locks the home)" } else { "" }
                    ),
                    Plan::AsConfigured => {
                        format!("3: {}'s home is not encrypted by dirseal; autologin as configured", c.user)
                    }
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
        }
        Ok(out)
    }

    /// The check run before the display managers start (`dirseal autologin check`): decides each
    /// configured autologin's case, unlocks the home (1), turns autologin off for this boot (2), or
    /// removes whatever an earlier check wrote (3, and managers without autologin).
    ///
    /// It fails closed: every automatic login is turned off first ([`turn_off`], no keystore, no
    /// TPM), and a manager's is turned back on only once every user it logs in has been decided
    /// case 1 or 3. An error, a crash or the unit's timeout on the way (a TPM that hangs, a key
    /// that is never touched) leaves it off: the greeter.
    pub fn autologin_check(&self, root: &Path, ui: &mut dyn Ui) -> Result<Vec<Outcome>, AutologinError> {
        // What an earlier check mounted may no longer be wanted (the configuration changed).
        lift_overlays(root)?;
        let off = turn_off(root)?;
        let mut out = Vec::new();
        for (list, written) in off {
            let mut outcomes = Vec::new();
            for c in list {
                outcomes.push(self.decide(c, ui)?);
            }
            let c = outcomes[0].configured.clone();
            let c = &c;
            let written = if outcomes.iter().any(|o| o.case == 2) {
                written
            } else if c.relogin && outcomes.iter().any(|o| o.case == 1) {
                // Autologin on, its relogin after a logout off: written over the off settings in
                // place, never through a moment with both on.
                apply(root, c, Override::NoRelogin)?
            } else {
                lift(root, c)?;
                Vec::new()
            };
            let off_for = outcomes.iter().find(|o| o.case == 2).map(|o| o.configured.user.clone());
            for mut o in outcomes {
                // One manager, one setting: a user it logs in on another seat (or by its timed
                // login) who needs the greeter gets it for all.
                if let Some(other) = off_for.as_ref().filter(|u| **u != o.configured.user) {
                    o.case = 2;
                    o.problems.push(format!("{other}, whom {} also logs in, needs the greeter", c.manager.name()));
                }
                o.written.clone_from(&written);
                out.push(o);
            }
        }
        Ok(out)
    }

    /// One autologin's case: the home opened (1), the greeter (2) or not dirseal's (3).
    fn decide(&self, c: Configured, ui: &mut dyn Ui) -> Result<Outcome, AutologinError> {
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
                        problems.push("no protector that needs no typing could open it (no TPM or key present)".into());
                    }
                    case = 2;
                }
            }
        }
        Ok(Outcome { configured: c, plan, case, opened_with, problems, written: Vec::new() })
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

    /// The one autologin `m` is configured with (the tests below configure at most one user).
    fn one(r: &Path, m: Manager) -> Option<Configured> {
        let mut list = configured(r, m).expect("read");
        assert!(list.len() <= 1, "{list:?}");
        list.pop()
    }

    /// Whom `m` logs in, and how, by `text` alone.
    fn logins_in(m: Manager, text: &str) -> Vec<(String, Kind)> {
        let mut set = Settings::new();
        m.settings(text, Path::new("/f"), &mut set);
        m.logins(&set).into_iter().map(|(u, k, _)| (u, k)).collect()
    }

    #[test]
    fn sddm_conf_d_is_overridden_by_a_dropin_the_main_file_needs_a_copy() {
        let root = tempfile::tempdir().expect("tempdir");
        let r = root.path();
        assert_eq!(one(r, Manager::Sddm), None);
        put(r, "/usr/lib/sddm/sddm.conf.d/default.conf", "[Autologin]\nUser=\nSession=\n");
        assert_eq!(one(r, Manager::Sddm), None, "an empty user is no autologin");
        put(
            r,
            "/etc/sddm.conf.d/steamos.conf",
            "[General]\nX=1\n# User=no\n[Autologin]\nUser = deck\nSession=gamescope\n",
        );
        let c = one(r, Manager::Sddm).expect("configured");
        assert_eq!((c.user.as_str(), c.file.as_path()), ("deck", Path::new("/etc/sddm.conf.d/steamos.conf")));
        assert!(c.overlays.is_empty(), "{c:?}");
        // dirseal's own drop-in is not configuration.
        put(r, "/etc/sddm.conf.d/zz-dirseal-autologin.conf", &Manager::Sddm.dropin_text(Override::Off, &[]));
        assert_eq!(one(r, Manager::Sddm).expect("configured").user, "deck");
        // A file sorting after the drop-in, and the main file, win over it.
        put(r, "/etc/sddm.conf.d/zzz.conf", "[Autologin]\nUser=kim\n");
        put(r, "/etc/sddm.conf", "[Autologin]\nUser=ana\n");
        let c = one(r, Manager::Sddm).expect("configured");
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
        assert_eq!(one(r, Manager::Lightdm), None, "other sections say nothing");
        put(r, "/usr/share/lightdm/lightdm.conf.d/01-debian.conf", "[Seat:*]\nautologin-user=kim\n");
        let c = one(r, Manager::Lightdm).expect("configured");
        assert_eq!((c.user.as_str(), c.overlays.len()), ("kim", 0));
        put(r, "/etc/lightdm/lightdm.conf", "[SeatDefaults]\nautologin-user=ana\nautologin-user-timeout=0\n");
        let c = one(r, Manager::Lightdm).expect("configured");
        assert_eq!((c.user.as_str(), c.overlays.len()), ("ana", 1));
        let off = Manager::Lightdm
            .turned_off("[SeatDefaults]\nautologin-user=ana\nautologin-user-timeout=0\n", Override::Off);
        assert_eq!(logins_in(Manager::Lightdm, &off), [], "{off}");
        assert!(off.contains("autologin-user-timeout=0"), "{off}");

        put(r, "/etc/gdm3/daemon.conf", "[daemon]\nAutomaticLogin=kim\n");
        assert_eq!(one(r, Manager::Gdm), None, "GDM needs AutomaticLoginEnable");
        put(r, "/etc/gdm3/daemon.conf", "[daemon]\nAutomaticLoginEnable = True\nAutomaticLogin=kim\n[security]\n");
        let c = one(r, Manager::Gdm).expect("configured");
        assert_eq!(
            (c.user.as_str(), c.overlays.as_slice()),
            ("kim", [PathBuf::from("/etc/gdm3/daemon.conf")].as_slice())
        );
        let off = Manager::Gdm
            .turned_off(&fs::read_to_string(at(r, Path::new("/etc/gdm3/daemon.conf"))).expect("read"), Override::Off);
        assert_eq!(logins_in(Manager::Gdm, &off), [], "{off}");
    }

    #[test]
    fn timed_logins_relogin_seats_and_guests() {
        use Kind::{Automatic, Timed};
        let u = |v: &[(&str, Kind)]| v.iter().map(|(u, k)| (u.to_string(), *k)).collect::<Vec<_>>();
        // GDM: the timed login is a login without asking too, and may name another user.
        let gdm = "[daemon]\nTimedLoginEnable=true\nTimedLogin=alice\nTimedLoginDelay=10\n";
        assert_eq!(logins_in(Manager::Gdm, gdm), u(&[("alice", Timed)]));
        assert_eq!(logins_in(Manager::Gdm, "[daemon]\nTimedLoginEnable=false\nTimedLogin=alice\n"), []);
        let both = "[daemon]\nAutomaticLoginEnable=1\nAutomaticLogin=bob\nTimedLoginEnable=true\nTimedLogin=alice\n";
        assert_eq!(logins_in(Manager::Gdm, both), u(&[("bob", Automatic), ("alice", Timed)]));
        assert_eq!(logins_in(Manager::Gdm, &Manager::Gdm.turned_off(both, Override::Off)), []);

        // LightDM: a timeout is a timed login; a seat's own section overrides [Seat:*]; a guest
        // (no home of dirseal's) and the session are no user.
        let ldm = "[Seat:*]\nautologin-user=kim\nautologin-user-timeout=30\nautologin-session=x\n";
        assert_eq!(logins_in(Manager::Lightdm, ldm), u(&[("kim", Timed)]));
        assert_eq!(logins_in(Manager::Lightdm, "[Seat:*]\nautologin-guest=true\nautologin-session=x\n"), []);
        let seats = "[SeatDefaults]\nautologin-user=kim\n[Seat:seat1]\nautologin-user=ana\n";
        assert_eq!(logins_in(Manager::Lightdm, seats), u(&[("kim", Automatic), ("ana", Automatic)]));
        assert_eq!(logins_in(Manager::Lightdm, &Manager::Lightdm.turned_off(seats, Override::Off)), []);
        let root = tempfile::tempdir().expect("tempdir");
        let r = root.path();
        fs::create_dir_all(at(r, Path::new("/etc/lightdm/lightdm.conf.d"))).expect("mkdir");
        put(r, "/etc/lightdm/lightdm.conf.d/10-seat.conf", seats);
        let list = configured(r, Manager::Lightdm).expect("read");
        assert_eq!(list.iter().map(|c| c.user.as_str()).collect::<Vec<_>>(), ["kim", "ana"]);
        // The drop-in empties the user of every seat the configuration names.
        let dropin = Manager::Lightdm.dropin_text(Override::Off, &list[0].seats);
        let both = format!("{seats}{dropin}");
        assert_eq!(logins_in(Manager::Lightdm, &both), [], "{dropin}");

        // SDDM: Relogin logs the user in again after each logout; NoRelogin keeps the login.
        put(r, "/etc/sddm.conf.d/steamos.conf", "[Autologin]\nRelogin=true\nUser=deck\n");
        let c = one(r, Manager::Sddm).expect("configured");
        assert!(c.relogin);
        put(r, "/etc/sddm.conf", "[Autologin]\nRelogin=true\n");
        let c = one(r, Manager::Sddm).expect("configured");
        assert_eq!((c.relogin, c.overlays.as_slice()), (true, [PathBuf::from("/etc/sddm.conf")].as_slice()));
        let kept = Manager::Sddm.turned_off("[Autologin]\nRelogin=true\nUser=deck\n", Override::NoRelogin);
        assert!(kept.ends_with("[Autologin]\nRelogin=false\nUser=deck\n"), "{kept}");
        let dropin = Manager::Sddm.dropin_text(Override::NoRelogin, &[]);
        assert!(dropin.contains("Relogin=false") && !dropin.contains("User="), "{dropin}");
    }

    #[test]
    fn a_foreign_file_with_the_dropin_name_is_never_overwritten_or_removed() {
        let root = tempfile::tempdir().expect("tempdir");
        let r = root.path();
        put(r, "/etc/sddm.conf.d/autologin.conf", "[Autologin]\nUser=deck\n");
        put(r, "/etc/sddm.conf.d/zz-dirseal-autologin.conf", "[General]\nmine=1\n");
        let c = one(r, Manager::Sddm).expect("configured");
        assert!(matches!(apply(r, &c, Override::Off), Err(AutologinError::Io { .. })));
        assert_eq!(clear(r).expect("clear"), Vec::<PathBuf>::new());
        let left = fs::read_to_string(at(r, Path::new("/etc/sddm.conf.d/zz-dirseal-autologin.conf"))).expect("kept");
        assert_eq!(left, "[General]\nmine=1\n");
    }
}
