//! New homes encrypted from birth, for `dirseal home create`, the PAM module's `mkhome` and the
//! service's `CreateHome`: the home (from the passwd entry) is created empty and root-only,
//! encrypted before anything is written to it, the skeleton is copied in, and only then is it
//! handed to its user. Nothing of it ever reaches the disk in plaintext, unlike `useradd -m`
//! followed by a conversion (which leaves the skeleton's plaintext in free blocks).
use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use dirseal_recovery::RecoveryKey;
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::process::{Gid, Uid};

use crate::ids::{KeyIdentifier, ProtectorId};
use crate::ops::{Dirseal, NewProtector, OpsError, ProtectorChoice};
use crate::protector::NewKind;
use crate::recovery::RecoveryError;
use crate::ui::{Ui, UiError};

/// The skeleton copied into a new home unless another is given (as useradd does).
pub const DEFAULT_SKEL: &str = "/etc/skel";
/// Where the home's mode and the first user uid are read from (as useradd does).
pub const LOGIN_DEFS: &str = "/etc/login.defs";

/// Why a home could not be made; a failure after encryption says what is left and how to redo it.
#[derive(Debug, thiserror::Error)]
pub enum HomeError {
    /// The account does not exist: the home is made for an existing account.
    #[error("there is no user {0:?} in the password database; create the account first (`useradd -M {0}`)")]
    NoSuchUser(String),
    /// The home already holds files: it is converted, not created.
    #[error("{user}'s home {path} already holds files; `dirseal convert {path}` encrypts a home that holds data")]
    NotEmpty {
        /// The account.
        user: String,
        /// Its home.
        path: PathBuf,
    },
    /// The home path is not a directory, not absolute, or could not be inspected or set up.
    #[error("{path}: {reason}")]
    Path {
        /// The path.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Copying the skeleton failed part-way; the message says how to clean up and start over.
    #[error("copying the skeleton {skel} into {home}: {reason}; {home} is encrypted and unlocked, still root's (mode 0700), and holds what was copied so far: remove it (`rm -r`, then `dirseal protector remove` for its protector) and run `dirseal home create` again")]
    Skel {
        /// The skeleton.
        skel: PathBuf,
        /// The home being filled.
        home: PathBuf,
        /// What failed.
        reason: String,
    },
    /// A skeleton named by a caller who may not read what root can (D-Bus) is not a root-owned
    /// tree in the allowed places: copying it would hand them root's files (`skel=/etc`: shadow).
    #[error("skeleton {skel}: {reason}; a skeleton named over D-Bus must be /etc/skel, or a directory below /etc/skel* or /usr/share/*/skel*, root's with every directory from / and every entry in it root's and no directory writable by group or others: put the files there as root, leave skel out (/etc/skel), or run `dirseal home create USER --skel DIR` as root")]
    SkelRefused {
        /// The skeleton named.
        skel: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Encrypting the home or making its protector failed.
    #[error(transparent)]
    Ops(#[from] OpsError),
    /// The Ui could not ask, or the person cancelled.
    #[error(transparent)]
    Ui(#[from] UiError),
    /// The recovery key could not be made or saved.
    #[error(transparent)]
    Recovery(#[from] RecoveryError),
}

/// What `/etc/login.defs` says about new homes (missing file or keys: shadow's defaults).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoginDefs {
    /// Accounts below it are system accounts: no home is made for them at login.
    pub uid_min: u32,
    /// The new home's mode: HOME_MODE, else 0777 less UMASK (as useradd does).
    pub home_mode: u32,
}

impl Default for LoginDefs {
    fn default() -> LoginDefs {
        LoginDefs { uid_min: 1000, home_mode: 0o755 }
    }
}

impl LoginDefs {
    /// Reads `path`; an unreadable file gives the defaults (useradd does the same).
    pub fn read(path: &Path) -> LoginDefs {
        std::fs::read_to_string(path).map(|t| LoginDefs::parse(&t)).unwrap_or_default()
    }

    pub(crate) fn parse(text: &str) -> LoginDefs {
        let mut uid_min = None;
        let mut home_mode = None;
        let mut umask = None;
        for line in text.lines() {
            let mut words = line.split_whitespace();
            let (Some(key), Some(value)) = (words.next(), words.next()) else { continue };
            // login.defs numbers are C literals: 0-prefixed octal, else decimal.
            let octal = || u32::from_str_radix(value, 8).ok().filter(|m| *m <= 0o7777);
            match key {
                "UID_MIN" => uid_min = value.parse().ok(),
                "HOME_MODE" => home_mode = octal(),
                "UMASK" => umask = octal(),
                _ => {}
            }
        }
        let d = LoginDefs::default();
        LoginDefs {
            uid_min: uid_min.unwrap_or(d.uid_min),
            home_mode: home_mode.or(umask.map(|u| 0o777 & !u)).unwrap_or(d.home_mode),
        }
    }
}

/// The account a home is made for, from the password database.
#[derive(Clone, Debug)]
pub struct Account {
    /// The account name.
    pub name: String,
    /// Its uid, which the home and its files are given.
    pub uid: u32,
    /// Its primary group, which the home and its files are given.
    pub gid: u32,
    /// Its home directory, as the password database says.
    pub home: PathBuf,
}

impl Account {
    /// Looks `user` up in the password database.
    pub fn named(user: &str) -> Result<Account, HomeError> {
        match nix::unistd::User::from_name(user) {
            Ok(Some(u)) => Ok(Account { name: u.name, uid: u.uid.as_raw(), gid: u.gid.as_raw(), home: u.dir }),
            _ => Err(HomeError::NoSuchUser(user.to_string())),
        }
    }
}

/// How to make the home.
#[derive(Clone, Debug)]
pub struct Options {
    /// Copied into the new home (modes, owners made the user's, symlinks, xattrs, times).
    pub skel: PathBuf,
    /// Seal the master key under a new recovery key; `None` asks the Ui.
    pub recovery_key: Option<bool>,
    /// The login.defs file giving the home's mode.
    pub login_defs: PathBuf,
    /// `skel` was named by a caller who may not read every file root can (a D-Bus caller, maybe
    /// an unprivileged administrator through polkit): it must pass [`vet_skel`]. Root at a
    /// terminal and root's own configuration (PAM's `skel=`) name any directory: root can copy
    /// any file anyway.
    pub skel_from_caller: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            skel: DEFAULT_SKEL.into(),
            recovery_key: None,
            login_defs: LOGIN_DEFS.into(),
            skel_from_caller: false,
        }
    }
}

/// Whether `skel` may be copied for a caller who may not read what root can: it is `/etc/skel`,
/// or below `/etc/skel*` or `/usr/share/*/skel*` (no `..`), every directory from `/` to it is
/// root's and writable by no group or other (so nobody else can swap what is checked before the
/// copy), and so is everything in it, every entry root's. Nothing is created before this passes.
pub fn vet_skel(skel: &Path) -> Result<(), HomeError> {
    use std::path::Component;
    let refuse = |reason: String| HomeError::SkelRefused { skel: skel.to_path_buf(), reason };
    let mut names = Vec::new();
    for c in skel.components() {
        match c {
            Component::RootDir => {}
            Component::Normal(n) => names.push(n),
            _ => return Err(refuse("it is not an absolute path without `.` or `..`".into())),
        }
    }
    let skel_named = |n: &OsStr| n.as_bytes().starts_with(b"skel");
    let is = |n: &OsStr, s: &str| n.as_bytes() == s.as_bytes();
    let allowed = matches!(names.as_slice(), [etc, n, ..] if is(etc, "etc") && skel_named(n))
        || matches!(names.as_slice(), [usr, share, _, n, ..] if is(usr, "usr") && is(share, "share") && skel_named(n));
    if !skel.has_root() || !allowed {
        return Err(refuse("it is not in the places allowed".into()));
    }
    let mut dir = open_dir_nofollow(None, OsStr::new("/")).map_err(|e| refuse(format!("/: {e}")))?;
    let mut at = PathBuf::from("/");
    root_tree(&dir, &at, false).map_err(refuse)?;
    for n in names {
        at.push(n);
        dir = open_dir_nofollow(Some(dir.as_fd()), n)
            .map_err(|e| refuse(format!("{}: {e} (symlinks are not followed)", at.display())))?;
        root_tree(&dir, &at, false).map_err(refuse)?;
    }
    root_tree(&dir, &at, true).map_err(refuse)
}

/// `dir` (at `at`) is root's and writable by no group or other; with `below`, so is every entry
/// under it (directories not writable by others either).
fn root_tree(dir: &OwnedFd, at: &Path, below: bool) -> Result<(), String> {
    let st = rustix::fs::fstat(dir).map_err(|e| format!("{}: {e}", at.display()))?;
    if st.st_uid != 0 || st.st_mode & 0o022 != 0 {
        return Err(format!("{} is not root's or is writable by group or others", at.display()));
    }
    if !below {
        return Ok(());
    }
    let entries = rustix::fs::Dir::read_from(dir).map_err(|e| format!("{}: {e}", at.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("{}: {e}", at.display()))?;
        let name = OsStr::from_bytes(entry.file_name().to_bytes());
        if name == "." || name == ".." {
            continue;
        }
        let path = at.join(name);
        let st =
            rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).map_err(|e| format!("{}: {e}", path.display()))?;
        if st.st_uid != 0 {
            return Err(format!("{} is not root's", path.display()));
        }
        if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
            let sub = open_dir_nofollow(Some(dir.as_fd()), name).map_err(|e| format!("{}: {e}", path.display()))?;
            root_tree(&sub, &path, true)?;
        }
    }
    Ok(())
}

/// A home made.
#[derive(Debug, serde::Serialize)]
pub struct Created {
    /// The account.
    pub user: String,
    /// Its uid.
    pub uid: u32,
    /// The home made.
    pub home: PathBuf,
    /// Its permission bits.
    pub mode: u32,
    /// The encryption policy of the home.
    pub policy: KeyIdentifier,
    /// The protector made for it.
    pub protector: ProtectorId,
    /// Entries copied from the skeleton.
    pub entries: u64,
    /// Special files (devices, fifos, sockets) of the skeleton, which are not copied.
    pub skipped: Vec<PathBuf>,
    /// Whether a recovery key was made (and shown through the Ui).
    pub recovery_key: bool,
}

/// Whether `home` needs creating: it does not exist, or is an empty directory. `Err` says why not.
pub(crate) fn check_absent_or_empty(acct: &Account) -> Result<bool, HomeError> {
    let home = &acct.home;
    let bad = |reason: &str| HomeError::Path { path: home.clone(), reason: reason.into() };
    match std::fs::symlink_metadata(home) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(e) => Err(bad(&format!("cannot inspect it: {e}"))),
        Ok(m) if !m.is_dir() => Err(bad("exists and is not a directory (symlinks are not followed)")),
        Ok(_) => match std::fs::read_dir(home).map(|mut d| d.next().is_none()) {
            Ok(true) => Ok(false),
            Ok(false) => Err(HomeError::NotEmpty { user: acct.name.clone(), path: home.clone() }),
            Err(e) => Err(bad(&format!("cannot list it: {e}"))),
        },
    }
}

/// Creates `acct`'s home encrypted, with a new protector of `kind` named after and owned by the
/// user (the Ui is asked what the kind needs: a new password, a PIN, a touch), copies the skeleton
/// in, then gives it to the user with login.defs' mode. Refused, with nothing written, when the
/// home holds files or its filesystem cannot encrypt.
///
/// Every question comes before the home is made or encrypted: the recovery key is asked, shown
/// and typed back first, and a cancel at the protector's own questions (asked while encrypting,
/// before anything is saved) removes the home again. Before, the recovery key was asked after
/// the encryption: a Ctrl-C there left an empty, encrypted, root-only home that a rerun refused
/// as "already encrypted", and that nobody could log in to. Such a half-made home (see
/// [`half_made`]) is finished by running this again.
pub fn create(
    ds: &mut Dirseal,
    acct: &Account,
    kind: NewKind,
    options: &Options,
    ui: &mut dyn Ui,
) -> Result<Created, HomeError> {
    let home = &acct.home;
    if !home.is_absolute() {
        return Err(HomeError::Path { path: home.clone(), reason: "the passwd entry's home is not absolute".into() });
    }
    let missing = check_absent_or_empty(acct)?;
    if options.skel_from_caller {
        vet_skel(&options.skel)?;
    }
    if !missing {
        if let Some((policy, protector)) = half_made(ds, acct)? {
            return finish_half_made(ds, acct, options, policy, protector, ui);
        }
    }
    let parent = home.parent().unwrap_or(Path::new("/"));
    // Nothing is created (directory, protector, policy) on a filesystem that cannot encrypt.
    let mp = crate::fscrypt::mount_point(parent).map_err(OpsError::from)?;
    crate::fscrypt::check_supported(&mp).map_err(OpsError::from)?;
    let key = ask_recovery_key(ds, home, options, ui)?;
    // Root's, and closed to everyone, until it is complete: the user cannot write into it (or
    // plant a symlink) while it is being filled.
    let io = |what: &str, e: std::io::Error| HomeError::Path { path: home.clone(), reason: format!("{what}: {e}") };
    if missing {
        rustix::fs::mkdir(home, Mode::from_raw_mode(0o700)).map_err(|e| io("cannot create it", e.into()))?;
    }
    let dir = open_dir_nofollow(None, home.as_os_str()).map_err(|e| io("cannot open it", e))?;
    let before = rustix::fs::fstat(&dir).map_err(|e| io("cannot inspect it", e.into()))?;
    let root_only = || -> std::io::Result<()> {
        rustix::fs::fchown(&dir, Some(Uid::ROOT), Some(Gid::ROOT))?;
        rustix::fs::fchmod(&dir, Mode::from_raw_mode(0o700))?;
        Ok(())
    };
    root_only().map_err(|e| io("cannot make it root's while it is made", e))?;
    let new = NewProtector { name: acct.name.as_str().into(), uid: Some(acct.uid), kind };
    let (policy, master) = match ds.encrypt(home, ProtectorChoice::New(new), ui) {
        Ok(p) => p,
        Err(e) => {
            // Nothing was written: the home is as it was (gone again, or its owner and mode back).
            if missing {
                let _ = std::fs::remove_dir(home);
            } else {
                let _ =
                    rustix::fs::fchown(&dir, Some(Uid::from_raw(before.st_uid)), Some(Gid::from_raw(before.st_gid)));
                let _ = rustix::fs::fchmod(&dir, Mode::from_raw_mode(before.st_mode & 0o7777));
            }
            return Err(e.into());
        }
    };
    // Invariant: a new policy has exactly the protector it was created with.
    let protector =
        *policy.wrapped.keys().next().ok_or_else(|| OpsError::NoProtector { what: home.display().to_string() })?;
    if let Some(key) = &key {
        ds.save_recovery_key(home, &policy.id, &master, key, Some(acct.uid))?.notice(home, ui);
    }
    fill_and_give(acct, options, &dir, (policy.id, protector), key.is_some(), ui)
}

/// Whether a recovery key is wanted (`options`, else the Ui is asked) and, if so, a new one
/// shown through the Ui (typed back there): nothing is saved, and a cancel leaves nothing.
fn ask_recovery_key(
    ds: &Dirseal,
    home: &Path,
    options: &Options,
    ui: &mut dyn Ui,
) -> Result<Option<RecoveryKey>, HomeError> {
    let want_key = ds.wants_recovery_key(home, options.recovery_key, ui)?;
    if !want_key {
        return Ok(None);
    }
    let key = RecoveryKey::generate();
    // Shown before it is saved: a key nobody received must not become the way in.
    ui.show_recovery_key(home, &key)?;
    Ok(Some(key))
}

/// A home that `create` encrypted but did not finish (it was interrupted, or the machine went
/// down): empty, root's with mode 0700, encrypted with a policy of the keystore that exactly one
/// protector opens, the account's own (its uid and its name). Its policy and protector; `None`
/// for anything else (an encrypted directory of any other making is left alone: encrypting it
/// again is refused as before).
pub fn half_made(ds: &Dirseal, acct: &Account) -> Result<Option<(KeyIdentifier, ProtectorId)>, HomeError> {
    use std::os::unix::fs::MetadataExt;
    let home = &acct.home;
    let Ok(meta) = std::fs::symlink_metadata(home) else { return Ok(None) };
    if !meta.is_dir() || meta.uid() != 0 || meta.gid() != 0 || meta.mode() & 0o7777 != 0o700 {
        return Ok(None);
    }
    if !std::fs::read_dir(home).is_ok_and(|mut d| d.next().is_none()) {
        return Ok(None);
    }
    if crate::fscrypt::get_policy(home).map_err(OpsError::from)?.is_none() {
        return Ok(None);
    }
    let Ok(policy) = ds.policy_of(home) else { return Ok(None) };
    if policy.medium.is_some() || policy.wrapped.len() != 1 {
        return Ok(None);
    }
    let Some(id) = policy.wrapped.keys().next().copied() else { return Ok(None) };
    match ds.keystore().protector(&id) {
        Ok(p) if p.uid == Some(acct.uid) && p.name == acct.name => Ok(Some((policy.id, id))),
        _ => Ok(None),
    }
}

/// Finishes a [`half_made`] home: the recovery key if wanted and there is none (asked first),
/// the key loaded if it is not (the protector's secret is asked), then the skeleton and the
/// handing over, as `create` would have.
fn finish_half_made(
    ds: &mut Dirseal,
    acct: &Account,
    options: &Options,
    policy: KeyIdentifier,
    protector: ProtectorId,
    ui: &mut dyn Ui,
) -> Result<Created, HomeError> {
    let home = &acct.home;
    ui.notice(&format!("{} was encrypted but not finished: finishing it", home.display()));
    let has_key = crate::recovery::read_blob(home)?.is_some();
    let key = if has_key { None } else { ask_recovery_key(ds, home, options, ui)? };
    let mp = crate::fscrypt::mount_point(home).map_err(OpsError::from)?;
    let loaded =
        crate::fscrypt::key_status(&mp, &policy).map_err(OpsError::from)? == crate::fscrypt::KeyStatus::Present;
    if key.is_some() || !loaded {
        let (_, master) = ds.master_key_of_dir(home, crate::ops::Pick { protector: Some(protector) }, ui)?;
        if !loaded {
            ds.add_key(home, &master)?;
        }
        if let Some(key) = &key {
            ds.save_recovery_key(home, &policy, &master, key, Some(acct.uid))?.notice(home, ui);
        }
    }
    let io = |what: &str, e: std::io::Error| HomeError::Path { path: home.clone(), reason: format!("{what}: {e}") };
    let dir = open_dir_nofollow(None, home.as_os_str()).map_err(|e| io("cannot open it", e))?;
    fill_and_give(acct, options, &dir, (policy, protector), has_key || key.is_some(), ui)
}

/// Copies the skeleton into the encrypted, unlocked, root-only home `dir`, then gives it to its
/// user with login.defs' mode.
fn fill_and_give(
    acct: &Account,
    options: &Options,
    dir: &OwnedFd,
    (policy, protector): (KeyIdentifier, ProtectorId),
    recovery_key: bool,
    ui: &mut dyn Ui,
) -> Result<Created, HomeError> {
    let home = &acct.home;
    let io = |what: &str, e: std::io::Error| HomeError::Path { path: home.clone(), reason: format!("{what}: {e}") };
    let defs = LoginDefs::read(&options.login_defs);
    let mut copy = Copy { owner: (acct.uid, acct.gid), entries: 0, skipped: Vec::new(), at: PathBuf::new() };
    let skel_err = |reason: String| HomeError::Skel { skel: options.skel.clone(), home: home.clone(), reason };
    match open_dir_nofollow(None, options.skel.as_os_str()) {
        Ok(skel) => copy.dir(skel.as_fd(), dir.as_fd()).map_err(|e| skel_err(format!("{}: {e}", copy.at.display())))?,
        // No skeleton (a minimal system): an empty home, as useradd makes.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(skel_err(format!("cannot open it: {e}"))),
    }
    let mode = defs.home_mode & 0o7777;
    let give = || -> std::io::Result<()> {
        rustix::fs::fchown(dir, Some(Uid::from_raw(acct.uid)), Some(Gid::from_raw(acct.gid)))?;
        rustix::fs::fchmod(dir, Mode::from_raw_mode(mode))?;
        Ok(())
    };
    give().map_err(|e| io("cannot give it to its user", e))?;
    ui.notice(&format!(
        "created {} for {}, encrypted (policy {policy}, protector {protector})",
        home.display(),
        acct.name,
    ));
    Ok(Created {
        user: acct.name.clone(),
        uid: acct.uid,
        home: home.clone(),
        mode,
        policy,
        protector,
        entries: copy.entries,
        skipped: copy.skipped,
        recovery_key,
    })
}

fn open_dir_nofollow(at: Option<BorrowedFd<'_>>, name: &OsStr) -> std::io::Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    Ok(match at {
        Some(d) => rustix::fs::openat(d, name, flags, Mode::empty())?,
        None => rustix::fs::open(name, flags, Mode::empty())?,
    })
}

/// A faithful copy of the skeleton into the new home, fd-relative and without following links.
struct Copy {
    owner: (u32, u32),
    entries: u64,
    skipped: Vec<PathBuf>,
    /// Where it is (relative to the skeleton), for errors.
    at: PathBuf,
}

impl Copy {
    fn dir(&mut self, src: BorrowedFd<'_>, dst: BorrowedFd<'_>) -> std::io::Result<()> {
        let mut names: Vec<Vec<u8>> = Vec::new();
        for entry in rustix::fs::Dir::read_from(src)? {
            let name = entry?.file_name().to_bytes().to_vec();
            if name != b"." && name != b".." {
                names.push(name);
            }
        }
        names.sort();
        for name in names {
            let name = OsStr::from_bytes(&name);
            self.at.push(name);
            self.entry(src, dst, name)?;
            self.at.pop();
        }
        Ok(())
    }

    fn entry(&mut self, src: BorrowedFd<'_>, dst: BorrowedFd<'_>, name: &OsStr) -> std::io::Result<()> {
        let st = rustix::fs::statat(src, name, AtFlags::SYMLINK_NOFOLLOW)?;
        let times = rustix::fs::Timestamps {
            last_access: rustix::fs::Timespec { tv_sec: st.st_atime as _, tv_nsec: st.st_atime_nsec as _ },
            last_modification: rustix::fs::Timespec { tv_sec: st.st_mtime as _, tv_nsec: st.st_mtime_nsec as _ },
        };
        let mode = Mode::from_raw_mode(st.st_mode & 0o7777);
        let (uid, gid) = (Some(Uid::from_raw(self.owner.0)), Some(Gid::from_raw(self.owner.1)));
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory => {
                rustix::fs::mkdirat(dst, name, Mode::from_raw_mode(0o700))?;
                let s = open_dir_nofollow(Some(src), name)?;
                let d = open_dir_nofollow(Some(dst), name)?;
                self.dir(s.as_fd(), d.as_fd())?;
                finish(s.as_fd(), d.as_fd(), uid, gid, mode, &times)?;
            }
            FileType::RegularFile => {
                let s =
                    rustix::fs::openat(src, name, OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())?;
                let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
                let d = rustix::fs::openat(dst, name, flags, Mode::from_raw_mode(0o600))?;
                let (mut sf, mut df) = (File::from(s), File::from(d));
                std::io::copy(&mut sf, &mut df)?;
                finish(sf.as_fd(), df.as_fd(), uid, gid, mode, &times)?;
            }
            FileType::Symlink => {
                let target = rustix::fs::readlinkat(src, name, Vec::new())?;
                rustix::fs::symlinkat(target.as_c_str(), dst, name)?;
                rustix::fs::chownat(dst, name, uid, gid, AtFlags::SYMLINK_NOFOLLOW)?;
                rustix::fs::utimensat(dst, name, &times, AtFlags::SYMLINK_NOFOLLOW)?;
            }
            _ => {
                self.skipped.push(self.at.clone());
                return Ok(());
            }
        }
        self.entries += 1;
        Ok(())
    }
}

/// The copy's metadata: xattrs (ACLs included) as the source has them, then the user as owner,
/// then the mode (after the chown, which clears set-id bits), then the times.
fn finish(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    uid: Option<Uid>,
    gid: Option<Gid>,
    mode: Mode,
    times: &rustix::fs::Timestamps,
) -> std::io::Result<()> {
    for (name, value) in xattrs(src)? {
        rustix::fs::fsetxattr(dst, name.as_c_str(), &value, rustix::fs::XattrFlags::empty())?;
    }
    rustix::fs::fchown(dst, uid, gid)?;
    rustix::fs::fchmod(dst, mode)?;
    rustix::fs::futimens(dst, times)?;
    Ok(())
}

/// Every xattr of an open file. The encryption context is not among them: the kernel keeps it
/// out of the xattr namespace.
fn xattrs(fd: BorrowedFd<'_>) -> std::io::Result<Vec<(std::ffi::CString, Vec<u8>)>> {
    let mut names = vec![0u8; 64 * 1024];
    let n = rustix::fs::flistxattr(fd, &mut names[..])?;
    names.truncate(n);
    let mut out = Vec::new();
    for raw in names.split(|b| *b == 0).filter(|s| !s.is_empty()) {
        let name = std::ffi::CString::new(raw).map_err(std::io::Error::other)?;
        let mut value = vec![0u8; 64 * 1024];
        let len = rustix::fs::fgetxattr(fd, name.as_c_str(), &mut value[..])?;
        value.truncate(len);
        out.push((name, value));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::{vet_skel, HomeError, LoginDefs};
    use std::path::Path;

    #[test]
    fn a_callers_skeleton_is_only_below_etc_skel_or_usr_share_skel() {
        for bad in
            ["/etc", "/etc/", "/", "/etc/skel/../shadow", "etc/skel", "/tmp/skel", "/usr/share/skel", "/home/x/skel"]
        {
            let e = vet_skel(Path::new(bad)).expect_err(bad);
            assert!(
                matches!(&e, HomeError::SkelRefused { reason, .. } if reason.contains("allowed") || reason.contains("absolute")),
                "{bad}: {e}"
            );
        }
        // In the allowed places, the tree decides (here: missing).
        for place in ["/etc/skel.dirseal-missing", "/usr/share/pkg/skel-missing/sub"] {
            let e = vet_skel(Path::new(place)).expect_err(place);
            assert!(e.to_string().contains("No such file"), "{place}: {e}");
        }
    }

    #[test]
    fn login_defs_home_mode_wins_over_umask() {
        let d = LoginDefs::parse("# c\nUID_MIN\t\t 2000\nUMASK 027\nHOME_MODE 0700\n");
        assert_eq!(d, LoginDefs { uid_min: 2000, home_mode: 0o700 });
        assert_eq!(LoginDefs::parse("UMASK 077\n").home_mode, 0o700);
        assert_eq!(LoginDefs::parse("UMASK 022\n").home_mode, 0o755);
        assert_eq!(LoginDefs::parse("").uid_min, 1000);
        assert_eq!(LoginDefs::parse("HOME_MODE bad\n").home_mode, 0o755);
    }
}
